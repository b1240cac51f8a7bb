"""Typed outcomes through the real Docker sandbox (docs/executor.md, "Outcomes"): a failure of the
machinery under a job is ``infra``, never a reward, and the next honest job scores full; what
the job itself does keeps its verdict.

The engine is never stopped: the pool talks to it through a socket proxy the test cuts
(tests/helpers.py, DockerSocketProxy); the runner's failures come from deterministic test hooks
(``Job.runner_hook``, honoured only by a pool started with ``test_hooks``)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.sandbox import DockerSandboxPool, Job, RunResult
from rollstream.consumers.executor.score import audit_record, evaluate
from rollstream.schemas.events import RewardSpec, outcome_of
from tests.helpers import DockerSocketProxy, wait_until

pytestmark = pytest.mark.sandbox

SPEC = RewardSpec(entry_point="f", tests=["assert f(1) == 2", "assert f(2) == 3"], timeout_s=10.0)
HONEST = "```python\ndef f(x):\n    return x + 1\n```"
SLOW = "```python\nimport time\ntime.sleep(4)\ndef f(x):\n    return x + 1\n```"


class Hooked:
    """The pool, with ``hook`` set on the next ``times`` jobs it is given."""

    def __init__(self, pool: DockerSandboxPool, hook: str, times: int = 1) -> None:
        self.pool, self.hook, self.left = pool, hook, times

    @property
    def limits(self) -> Any:
        return self.pool.limits

    async def execute(self, job: Job) -> RunResult:
        if self.left > 0:
            self.left -= 1
            job = msgspec.structs.replace(job, runner_hook=self.hook)
        return await self.pool.execute(job)


def config(image: str, owner: str, **extra: Any) -> ExecutorConfig:
    return ExecutorConfig(image=image, owner=owner, pool_size=1, concurrency=1, recycle_after=500, **extra)


async def mid_job(pool: DockerSandboxPool) -> None:
    """Until the pool's one container has the job (SLOW sleeps 4 s in it), and a second more."""
    await wait_until(lambda: pool._idle.empty(), "the job is handed to its sandbox", 30, 0.01)
    await asyncio.sleep(1.0)


def infra(evaluation: Any) -> str:
    """The cause of an ``infra`` evaluation (failing when it is anything else)."""
    scored = evaluation.scored
    assert scored.execution.error_kind == "infra" and scored.reward == 0.0 and not scored.components, scored
    assert outcome_of(scored.execution.error_kind, scored.execution.passed) == "infra"
    assert evaluation.result is None and evaluation.lost
    return evaluation.lost[-1]


async def full(backend: Any, registry: Any, job_id: str) -> Any:
    evaluation = await evaluate(backend, registry, SPEC, HONEST, job_id)
    assert evaluation.scored.reward == 1.0, evaluation.scored.execution
    return evaluation


async def test_the_engine_unreachable_mid_job_is_infra_and_the_next_job_scores_full(sandbox_image, owner, registry):
    with tempfile.TemporaryDirectory() as tmp:
        async with DockerSocketProxy(str(Path(tmp) / "docker.sock")) as proxy:
            async with DockerSandboxPool(config(sandbox_image, owner, docker_url=proxy.url)) as pool:
                warm = next(iter(pool._all))
                job = asyncio.create_task(evaluate(pool, registry, SPEC, SLOW, "cut/0", attempts=1))
                await mid_job(pool)
                proxy.cut()
                evaluation = await job
                assert infra(evaluation) in ("engine_unreachable", "stream_lost")
                audit = audit_record(evaluation, pool.limits, "cut/0", 0.0)
                assert audit.outcome == "infra" and audit.verdict == "infra" and audit.violations[0].startswith("lost:")
                proxy.restore()
                after = await full(pool, registry, "cut/1")  # on a fresh container
                assert after.result.sandbox_id != warm.sandbox_id and not after.lost


async def test_a_container_killed_from_outside_runs_the_job_again_on_a_fresh_one(sandbox_image, owner, registry):
    import aiodocker

    async with DockerSandboxPool(config(sandbox_image, owner)) as pool:
        warm = next(iter(pool._all))
        job = asyncio.create_task(evaluate(pool, registry, SPEC, SLOW, "kill/0"))  # attempts: the default 3
        await mid_job(pool)
        async with aiodocker.Docker() as docker:
            await docker.containers.container(warm.container.id).kill()
        evaluation = await job
        assert evaluation.scored.reward == 1.0, evaluation.scored.execution  # the honest verdict, from its rerun
        assert evaluation.lost in (["container_killed"], ["container_gone"])
        assert evaluation.result.sandbox_id != warm.sandbox_id


@pytest.mark.parametrize("hook, cause", [("exit_before_reply", "runner_died"), ("raise", "runner_error")])
async def test_a_runner_that_fails_before_its_reply_is_infra(sandbox_image, owner, registry, hook, cause):
    async with DockerSandboxPool(config(sandbox_image, owner), test_hooks=True) as pool:
        evaluation = await evaluate(Hooked(pool, hook), registry, SPEC, HONEST, f"{hook}/0", attempts=1)
        assert infra(evaluation) in (cause, "container_gone")  # an exited container may be auto-removed first
        await full(pool, registry, f"{hook}/1")
        # with runs left, the same failure once is only a retry: the job's own verdict
        retried = await evaluate(Hooked(pool, hook), registry, SPEC, HONEST, f"{hook}/2", attempts=2)
        assert retried.scored.reward == 1.0 and len(retried.lost) == 1


async def test_the_job_that_loses_the_zygotes_says_so_and_keeps_its_verdict(sandbox_image, owner, registry):
    """Detected at the end of the job that caused it: its reply is marked unfit (not clean), so
    the container is retired at once, with no message text to match."""
    async with DockerSandboxPool(config(sandbox_image, owner), test_hooks=True) as pool:
        first = await full(Hooked(pool, "lose_zygotes"), registry, "zygotes/0")
        assert first.result.recycled and not first.lost
        second = await full(pool, registry, "zygotes/1")
        assert second.result.sandbox_id != first.result.sandbox_id and not second.lost


async def test_a_container_unfit_before_a_job_runs_it_on_a_fresh_one(sandbox_image, owner, registry):
    """The zygote-loss path (a container that lost its zygotes while idle): the runner refuses
    the job with a structured ``ran: false``, and the job runs on a fresh container."""
    async with DockerSandboxPool(config(sandbox_image, owner), test_hooks=True) as pool:
        first = await full(Hooked(pool, "lose_zygotes_idle"), registry, "idle/0")
        assert not first.result.recycled  # it looked clean when it answered
        second = await full(pool, registry, "idle/1")
        assert second.lost == ["container_unfit"] and second.result.sandbox_id != first.result.sandbox_id
        third = await evaluate(Hooked(pool, "lose_zygotes_idle"), registry, SPEC, HONEST, "idle/2")
        lost = await evaluate(pool, registry, SPEC, HONEST, "idle/3", attempts=1)
        assert third.scored.reward == 1.0 and infra(lost) == "container_unfit"


@pytest.mark.parametrize("code, outcome", [
    ("import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(0.5)", "violation"),  # kills its zygote
    ("x = bytearray(1 << 40)", "error"),  # MemoryError under the address-space limit
    ("import time\nwhile True:\n    pass", "timeout"),
])
async def test_what_the_job_does_is_its_own_verdict_never_infra(pool, registry, code, outcome, sandbox_runtime):
    spec = msgspec.structs.replace(SPEC, timeout_s=2.0)
    evaluation = await evaluate(pool, registry, spec, f"```python\n{code}\n```", "own/0", attempts=1)
    record = evaluation.scored.execution
    if sandbox_runtime == "runsc" and outcome == "violation":
        outcome = "error"  # the zygote is another uid's there: the kill raises PermissionError, no reward
        assert evaluation.scored.reward <= 0 and not evaluation.lost, record
    else:
        assert evaluation.scored.reward < 0
    assert outcome_of(record.error_kind, record.passed) in (outcome, "oom") and not evaluation.lost, record
    await full(pool, registry, "own/1")


KILL_THE_JUDGE = (  # every process of the job's but itself: its judge (a zygote's child other than itself)
    "import os, time\n"
    "time.sleep(0.2)\n"
    "me, zygote = os.getpid(), os.getppid()\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit() and int(p) not in (1, me, zygote):\n"
    "        try:\n"
    "            if int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1]) != 1:\n"
    "                os.kill(int(p), 9)\n"
    "        except OSError:\n"
    "            pass\n"
    "def f(x):\n    return x + 1\n"
)


async def test_a_judge_killed_before_it_says_its_pid_is_a_violation_at_once(sandbox_image, owner, registry):
    """The judge forked ahead takes the job's command, then says its pid: a candidate that kills
    it in between (the one process of its uid; here the hook widens the gap) leaves the runner no
    pid to wait for. Its zygote's report of that child's end is the judge's end: a violation,
    without the wait to the deadline and the zygotes' grace that once made it
    runner_zygote_unresponsive."""
    async with DockerSandboxPool(config(sandbox_image, owner), test_hooks=True) as pool:
        spec = msgspec.structs.replace(SPEC, timeout_s=5.0)
        hooked = Hooked(pool, "judge_slow_to_say_pid")
        evaluation = await evaluate(hooked, registry, spec, f"```python\n{KILL_THE_JUDGE}\n```", "slow/0", attempts=1)
        record = evaluation.scored.execution
        assert outcome_of(record.error_kind, record.passed) == "violation" and evaluation.scored.reward < 0, record
        assert "judge_killed:9" in record.error_message and "runner_zygote" not in record.error_message, record
        assert record.duration_s < spec.timeout_s, record  # no wait for the deadline
        assert not evaluation.lost  # the job's own verdict, never infra
        await full(Hooked(pool, "judge_slow_to_say_pid"), registry, "slow/1")  # the hook alone costs nothing
