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
from rollstream.consumers.executor.jobs import Job, RunResult
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.score import audit_record, evaluate
from rollstream.schemas.events import RewardSpec, outcome_of
from tests.helpers import DockerSocketProxy, wait_until

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

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


# What a job can leave on the runner's open files that its processes hold as their own stdout,
# stderr and report descriptors (runtime/host.py ``reset_shared_fds``): O_ASYNC with an owner
# and a signal of its choice makes every later read of that pipe by PID 1 signal the owner, once
# the job is over. Its zygote stopped (or killed) after the reply left the next honest job a zygote
# that never forks its processes: a timeout past the host's limit (runner_unresponsive, -0.2), or
# runner_zygote_died. Through a link to /proc/self/fd/1 the tests reopen the pipe (a file of their
# own, closed with the job; refused under runsc, where it is root's).
ARM = (
    "import fcntl, os, signal\n"
    "def arm(fd, owner, sig):\n"
    "    fcntl.fcntl(fd, fcntl.F_SETOWN, owner)\n"
    "    fcntl.fcntl(fd, 10, sig)  # F_SETSIG\n"
    "    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_ASYNC | os.O_NONBLOCK)\n"
)
# (id, the completion's first lines, a test of the tests' own, whether PID 1 reads nothing of the
# armed pipe while the job runs: then the signal can only come after it, and must never come)
LEFT_ON_SHARED_FILES = [
    ("sigstop-to-its-zygote", ARM + "arm(1, os.getppid(), signal.SIGSTOP)\narm(2, os.getppid(), signal.SIGSTOP)\n",
     None, True),
    ("sigkill-to-its-zygote", ARM + "arm(1, os.getppid(), signal.SIGKILL)\n", None, True),
    # PID 1 empties the report pipe every 20 ms while the job runs: the judge's zygote may stop then
    # (the job's own violation), or just after (the next job is refused, and runs on a fresh one)
    ("sigstop-through-the-tests-report-pipe", "", "import fcntl, os, signal\n"
     "fcntl.fcntl(5, fcntl.F_SETOWN, os.getppid())\nfcntl.fcntl(5, 10, signal.SIGSTOP)\n"
     "fcntl.fcntl(5, fcntl.F_SETFL, fcntl.fcntl(5, fcntl.F_GETFL) | os.O_ASYNC)", False),
    ("pipe-shrunk", "import fcntl\nfor fd in (1, 2):\n    fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ\n", None, True),
    ("link-to-stdout-written-by-the-tests", "import os\nos.symlink('/proc/self/fd/1', '/work/out')\n",
     "try:\n    open('/work/out', 'w').write('{\"idle\": true}\\n' * 3)\nexcept OSError:\n    pass", True),
    ("link-to-stdout-read-by-the-tests", "import os\nos.symlink('/proc/self/fd/1', '/work/out')\n",
     "try:\n    open('/work/out').read()\nexcept OSError:\n    pass", True),
]
HONEST_FORMS = {
    "judged": SPEC,
    "in_process": msgspec.structs.replace(SPEC, trust="in_process"),
    "pytest": RewardSpec(kind="python_pytest", entry_point="f", timeout_s=10.0,
                         tests=["from solution import f\n\ndef test_f():\n    assert f(1) == 2\n"]),
}


@pytest.mark.parametrize("prelude, test, after_only", [a[1:] for a in LEFT_ON_SHARED_FILES],
                         ids=[a[0] for a in LEFT_ON_SHARED_FILES])
async def test_what_a_job_leaves_on_the_runners_files_never_reaches_the_next_job(sandbox_image, owner, registry,
                                                                                 prelude, test, after_only):
    """The runner resets its shared files once the job's processes are gone, before it reads those
    pipes again: every form of honest job after it scores full, with no refusal, on the same
    container (or, where the signal reached the zygote while the job still ran, which is that job's
    own violation, on the fresh one that replaced it)."""
    async with DockerSandboxPool(config(sandbox_image, owner)) as pool:
        spec = msgspec.structs.replace(SPEC, timeout_s=2.0, tests=SPEC.tests + ([test] if test else []))
        code = f"```python\n{prelude}def f(x):\n    return x + 1\n```"
        hostile = await evaluate(pool, registry, spec, code, "left/0", attempts=1)
        assert not hostile.lost, hostile.scored.execution
        refused = 0
        for form, honest in HONEST_FORMS.items():
            for i in range(2):
                after = await evaluate(pool, registry, honest, HONEST, f"left/{form}/{i}")
                assert after.scored.reward == 1.0, (form, after.scored.execution)
                refused += len(after.lost)
                if after_only:  # the cause is gone: no refusal, no replacement
                    assert not after.lost and after.result.sandbox_id == hostile.result.sandbox_id
                else:
                    assert after.lost in ([], ["container_unfit"]), after.lost
        assert pool.recycled == int(hostile.result.recycled) + refused <= 1


async def test_a_zygote_that_stops_answering_after_a_job_refuses_the_next_one(sandbox_image, owner, registry):
    """Whatever leaves a zygote unable to fork its child ahead after a reply (here a test hook stops
    it): the runner refuses the next job itself (``ran: false``, no message more per job), so that
    job runs on a fresh container and keeps its full score, and the container is replaced."""
    async with DockerSandboxPool(config(sandbox_image, owner), test_hooks=True) as pool:
        first = await full(Hooked(pool, "stop_zygote_idle"), registry, "stopped/0")
        assert not first.result.recycled  # it looked clean when it answered
        second = await full(pool, registry, "stopped/1")
        assert second.lost == ["container_unfit"] and second.result.sandbox_id != first.result.sandbox_id
        assert pool.recycled == 1
        third = await full(pool, registry, "stopped/2")  # the fresh one serves on
        assert third.result.sandbox_id == second.result.sandbox_id and not third.lost and pool.recycled == 1


FORGED_REPLY = (  # a made-up answer on the candidate's reply pipe before the judge asked (tamper: protocol)
    "import json, os\n"
    "def frame(obj):\n"
    "    data = json.dumps(obj).encode()\n"
    "    return len(data).to_bytes(4, 'big') + data\n"
    "for seq in range(1, 4):\n"
    "    os.write(4, frame([seq, 'ok', seq + 2, '', []]))\n"
)
LEFT_RUNNING = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"  # stray_processes


@pytest.mark.parametrize("code, outcome", [(FORGED_REPLY, "violation"), (LEFT_RUNNING, "violation")],
                         ids=["tamper", "stray-process"])
async def test_a_job_judged_a_violation_retires_its_container(sandbox_image, owner, registry, code, outcome):
    """An attack on the verdict (tamper) or on the sandbox (a process left running): its verdict is a
    violation, its container is retired before another job, and the next honest job scores full on
    a fresh one."""
    async with DockerSandboxPool(config(sandbox_image, owner)) as pool:
        spec = msgspec.structs.replace(SPEC, timeout_s=3.0)
        hostile = await evaluate(pool, registry, spec, f"```python\n{code}def f(x):\n    return x + 1\n```",
                                 "attack/0", attempts=1)
        record = hostile.scored.execution
        assert outcome_of(record.error_kind, record.passed) == outcome and hostile.scored.reward < 0, record
        assert hostile.result.recycled and audit_record(hostile, pool.limits, "attack/0", 0.0).recycled
        after = await full(pool, registry, "attack/1")
        assert after.result.sandbox_id != hostile.result.sandbox_id and not after.lost and pool.recycled == 1


async def test_honest_jobs_retire_no_container(sandbox_image, owner, registry):
    """Honest work of every form, passing or not (a wrong answer, an exception, a timeout), is no
    reason to replace a container: two containers serve 24 jobs, two at a time, and none is retired."""
    cfg = msgspec.structs.replace(config(sandbox_image, owner), pool_size=2, concurrency=2)
    wrong = "```python\ndef f(x):\n    return x\n```"
    raises = "```python\ndef f(x):\n    raise ValueError(x)\n```"
    slow = "```python\nimport time\ndef f(x):\n    time.sleep(5)\n```"
    jobs = [(spec, code) for spec in HONEST_FORMS.values() for code in (HONEST, HONEST, wrong, raises)]
    jobs += [(msgspec.structs.replace(SPEC, timeout_s=1.0), slow)] * 2
    jobs += [(SPEC, HONEST)] * (24 - len(jobs))
    async with DockerSandboxPool(cfg) as pool:
        started = {w.sandbox_id for w in pool._all}
        evaluations = await asyncio.gather(*(evaluate(pool, registry, spec, code, f"honest/{i}", attempts=1)
                                             for i, (spec, code) in enumerate(jobs)))
        for (_, code), evaluation in zip(jobs, evaluations, strict=True):
            assert not evaluation.lost and not evaluation.result.recycled, evaluation.scored.execution
            if code == HONEST:
                assert evaluation.scored.reward == 1.0, evaluation.scored.execution
        assert pool.recycled == 0 and {e.result.sandbox_id for e in evaluations} <= started


STOP_THE_PYTEST_ZYGOTE = (  # the zygote PID 1 forked last: the pytest files' one, which this job never needs
    "import os, signal\n"
    "zygotes = sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != 1\n"
    "                 and open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1] == '1')\n"
    "try:\n"
    "    os.kill(zygotes[-1], signal.SIGSTOP)\n"
    "except OSError:\n"
    "    pass\n"
)


async def test_a_job_that_stops_a_zygote_it_does_not_need_is_a_violation(sandbox_image, owner, registry,
                                                                          sandbox_runtime):
    """Nothing in a job without pytest files waits on the pytest zygote, so its stop went unseen and
    the next pytest file on that container timed out (runner_unresponsive, -0.2). PID 1, the zygotes'
    parent, learns of the stop after the job: the job's violation, and the container is replaced.
    Under runsc the zygote is root's and the kill is refused: the container serves on."""
    async with DockerSandboxPool(config(sandbox_image, owner)) as pool:
        spec = msgspec.structs.replace(SPEC, timeout_s=3.0)
        hostile = await evaluate(pool, registry, spec, f"```python\n{STOP_THE_PYTEST_ZYGOTE}def f(x):\n    return x + 1\n```",
                                 "stop/0", attempts=1)
        record = hostile.scored.execution
        if sandbox_runtime == "runsc":
            assert hostile.scored.reward == 1.0 and not hostile.result.recycled, record
        else:
            assert outcome_of(record.error_kind, record.passed) == "violation" and hostile.scored.reward < 0, record
            assert "runner_zygote_stopped" in record.error_message and hostile.result.recycled, record
        after = await evaluate(pool, registry, HONEST_FORMS["pytest"], HONEST, "stop/1", attempts=1)
        assert after.scored.reward == 1.0 and not after.lost, after.scored.execution
        assert (after.result.sandbox_id != hostile.result.sandbox_id) == hostile.result.recycled
