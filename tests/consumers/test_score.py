"""evaluate(): the sandbox backend is retried on SandboxError only, then the error propagates."""

from __future__ import annotations

import pytest

from rollstream.consumers.rewards import default_registry
from rollstream.consumers.sandbox import Job, RunResult
from rollstream.consumers.score import evaluate
from rollstream.errors import SandboxError
from rollstream.schemas.events import RewardSpec

SPEC = RewardSpec(entry_point="f", tests=["assert f(1) == 2"])
COMPLETION = "```python\ndef f(x):\n    return x + 1\n```"
PASSED = [{"e": "compiled"}, {"e": "code_ok"}, {"e": "test", "i": 0, "ok": True}, {"e": "done"}]


class FlakySandbox:
    """Fails with ``error`` ``failures`` times, then reports every test passed."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.jobs = failures, error, 0

    async def execute(self, job: Job) -> RunResult:
        self.jobs += 1
        if self.jobs <= self.failures:
            raise self.error
        return RunResult(sandbox_id="sbx", container_id="c", exit_code=0, events=PASSED)


async def test_a_backend_hiccup_is_retried() -> None:
    backend = FlakySandbox(1, SandboxError("sandbox died while idle"))
    evaluation = await evaluate(backend, default_registry(), SPEC, COMPLETION, "g/0", attempts=2)
    assert backend.jobs == 2 and evaluation.scored.reward == 1.0


async def test_a_backend_that_keeps_failing_raises_after_its_attempts() -> None:
    backend = FlakySandbox(5, SandboxError("no sandbox can be started"))
    with pytest.raises(SandboxError, match="no sandbox can be started"):
        await evaluate(backend, default_registry(), SPEC, COMPLETION, "g/0", attempts=2)
    assert backend.jobs == 2


async def test_other_errors_are_not_retried() -> None:
    backend = FlakySandbox(5, RuntimeError("a bug"))
    with pytest.raises(RuntimeError):
        await evaluate(backend, default_registry(), SPEC, COMPLETION, "g/0")
    assert backend.jobs == 1
