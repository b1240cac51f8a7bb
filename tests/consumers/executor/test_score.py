"""evaluate(): the sandbox backend is retried on SandboxError only, then the error propagates."""

from __future__ import annotations

import pytest

from rollstream.consumers.executor.jobs import Job, RunResult
from rollstream.consumers.executor.rewards import default_registry
from rollstream.consumers.executor.score import evaluate
from rollstream.errors import SandboxError, SandboxLost
from rollstream.schemas.events import RewardSpec

pytestmark = pytest.mark.unit

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


async def test_a_job_the_machinery_loses_runs_again_and_keeps_its_own_verdict() -> None:
    backend = FlakySandbox(2, SandboxLost("the container was killed during job g/0", "container_killed"))
    evaluation = await evaluate(backend, default_registry(), SPEC, COMPLETION, "g/0", attempts=3)
    assert backend.jobs == 3 and evaluation.scored.reward == 1.0
    assert evaluation.lost == ["container_killed", "container_killed"]


async def test_a_job_lost_on_every_run_is_infra_never_a_reward_and_never_stops_the_stage() -> None:
    from rollstream.consumers.executor.score import audit_record
    from rollstream.schemas.events import SandboxLimits, outcome_of

    backend = FlakySandbox(5, SandboxLost("runner error: boom", "runner_error"))
    evaluation = await evaluate(backend, default_registry(), SPEC, COMPLETION, "g/0", attempts=2)
    record = evaluation.scored.execution
    assert backend.jobs == 2 and evaluation.scored.reward == 0.0 and evaluation.scored.components == {}
    assert record.error_kind == "infra" and outcome_of(record.error_kind, record.passed) == "infra"
    assert "runner_error" in record.error_message and evaluation.lost == ["runner_error"] * 2
    limits = SandboxLimits(timeout_s=5, memory_mb=256, pids=64, cpus=1, output_bytes=1024, tmpfs_mb=16)
    audit = audit_record(evaluation, limits, "g/0", 1.0)
    assert audit.outcome == "infra" and audit.violations == ["lost:runner_error"] * 2 and audit.code_sha256


async def test_other_errors_are_not_retried() -> None:
    backend = FlakySandbox(5, RuntimeError("a bug"))
    with pytest.raises(RuntimeError):
        await evaluate(backend, default_registry(), SPEC, COMPLETION, "g/0")
    assert backend.jobs == 1


class RecordingSandbox(FlakySandbox):
    def __init__(self) -> None:
        super().__init__(0, RuntimeError())
        self.timeouts: list[float] = []

    async def execute(self, job: Job) -> RunResult:
        self.timeouts.append(job.timeout_s)
        return await super().execute(job)


async def test_an_event_may_lower_the_timeout_but_never_raise_it_above_the_stage_ceiling() -> None:
    """A spec asking for 600 s (the schema allows it) runs with the executor's max_timeout_s."""
    import msgspec

    backend = RecordingSandbox()
    for asked in (600.0, 2.0):
        await evaluate(backend, default_registry(), msgspec.structs.replace(SPEC, timeout_s=asked), COMPLETION, "g/0",
                       max_timeout_s=30.0)
    assert backend.timeouts == [30.0, 2.0]


def test_the_stage_ceilings_must_admit_their_defaults() -> None:
    from rollstream.config_load import load_config
    from rollstream.errors import ConfigError

    with pytest.raises(ConfigError, match="max_timeout_s"):
        load_config(None, ["executor.default_timeout_s=90"])
    with pytest.raises(ConfigError, match="max_new_tokens_limit"):
        load_config(None, ["generator.max_new_tokens=9000"])
