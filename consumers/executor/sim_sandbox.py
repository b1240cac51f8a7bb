"""``executor.backend = "sim"``: a sandbox backend that runs nothing and scores by a rule.

For capacity planning and pipeline tests without Docker (see docs/capacity.md): a job whose code
is one of the known reference solutions (whitespace-normalised) passes every test; code that
compiles otherwise fails every test; code that does not compile is a syntax error. Each
execution takes ``executor.backend.seconds``. The executor's scoring around it (reward kinds,
components, audit records) is the real one. Never use it to train a model: nothing is checked.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Iterable
from typing import Any

from rollstream.config import Config
from rollstream.consumers.executor.jobs import Job, RunResult, limits_from_config
from rollstream.schemas.events import SandboxLimits

CACHE_ENTRIES = 1 << 14  # verdicts kept by code (least recently used dropped first)


def normalised(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines() if line.strip())


class SimSandbox:
    def __init__(self, config: Config, references: Iterable[str]) -> None:
        self.seconds = config.executor.backend.seconds
        self.references = {normalised(code) for code in references if code}
        self._limits = limits_from_config(config.executor)
        self._judge = functools.lru_cache(maxsize=CACHE_ENTRIES)(self._verdict)

    @classmethod
    def from_config(cls, config: Config) -> SimSandbox:
        from rollstream.tasks.sources import load_tasks

        references = []
        for task in load_tasks(config.sampler.sources):
            references.append(task.reference_solution or "")
            steps = [s.reference or "" for s in task.reward.subtasks]
            # a subtask chain runs the code of the steps passed, then the step's own
            references += ["\n".join(normalised(code) for code in steps[: k + 1]) for k in range(len(steps))]
        return cls(config, references)

    @property
    def limits(self) -> SandboxLimits:
        return self._limits

    def judged(self, code: str) -> tuple[dict[str, Any] | None, bool]:
        """(the syntax error event or None, whether it is a reference), cached: completions repeat."""
        syntax, ok = self._judge(code)
        return (dict(syntax) if syntax is not None else None), ok

    def _verdict(self, code: str) -> tuple[dict[str, Any] | None, bool]:
        try:
            compile(code, "<completion>", "exec")
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
            line = getattr(exc, "lineno", None)
            return {"e": "syntax", "type": type(exc).__name__, "line": line, "msg": str(exc)[:300]}, False
        return None, normalised(code) in self.references

    async def execute(self, job: Job) -> RunResult:
        started = time.perf_counter()
        if self.seconds:
            await asyncio.sleep(self.seconds)
        syntax, ok = self.judged(job.code)
        events: list[dict[str, Any]]
        if syntax is not None:
            events = [syntax]
        else:
            events = [{"e": "compiled"}, {"e": "code_ok"},
                      *({"e": "test", "i": i, "ok": ok} for i in range(len(job.tests))), {"e": "done"}]
        return RunResult(sandbox_id=f"sim-{uuid.uuid4().hex[:8]}", container_id="sim", exit_code=0,
                         duration_s=time.perf_counter() - started, events=events)
