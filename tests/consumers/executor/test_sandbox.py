"""The Docker sandbox pool: hardening as Docker reports it, isolation between executions in one
container, recycling, labels and orphan removal, and the real scoring path end to end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from rollstream.config import Config, ExecutorConfig
from rollstream.consumers.executor.hardening import RUNSC_CAPS, RUNSC_HOST_TASKS
from rollstream.consumers.executor.jobs import Job
from rollstream.consumers.executor.pool import (
    HOST_LABEL,
    LABEL,
    OWNER_LABEL,
    PROCESS_LABEL,
    DockerSandboxPool,
    remove_orphans,
)
from rollstream.consumers.executor.rewards import RewardRegistry
from rollstream.consumers.executor.score import evaluate, score_file
from rollstream.errors import SandboxError
from rollstream.schemas.events import RewardSpec
from tests.helpers import containers_of, wait_until

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

ROOT = Path(__file__).resolve().parents[3]  # the repository (not tests/, whose rollstream/ holds tests)


async def inspect(container_id: str) -> dict:
    import aiodocker

    async with aiodocker.Docker() as docker:
        return await docker.containers.container(container_id).show()


async def test_containers_are_hardened(pool: DockerSandboxPool, owner: str, sandbox_runtime: str):
    (warm,) = list(pool._all)
    info = await inspect(warm.container.id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none" and info["Config"]["NetworkDisabled"]
    assert host["ReadonlyRootfs"] is True
    assert "no-new-privileges" in host["SecurityOpt"] and host["Privileged"] is False
    assert host["Runtime"] == pool.config.runtime == sandbox_runtime
    if sandbox_runtime == "runsc":  # PID 1 is gVisor's root with the capabilities to drop each job's uid
        assert host["CapDrop"] == ["ALL"] and host["CapAdd"] == RUNSC_CAPS
        assert info["Config"]["User"] == "0:0" and host["PidsLimit"] == RUNSC_HOST_TASKS
        assert f"ROLLSTREAM_NPROC={pool.config.pids}" in info["Config"]["Env"]
    else:
        assert host["CapDrop"] == ["ALL"] and not host.get("CapAdd")
        assert info["Config"]["User"] == "65534:65534"
        assert host["PidsLimit"] == pool.config.pids
    assert host["Memory"] == host["MemorySwap"] > 0
    # the runner proved the job's uid cannot open its descriptors (/proc/1/fd), and that no SysV
    # IPC object exists (the kernel's own counts)
    assert warm.ready["channels_guarded"] is True and warm.ready["sysv_ipc_objects"] == 0
    assert host["NanoCpus"] == int(pool.config.cpus * 1e9)
    assert "size=16m" in host["Tmpfs"]["/work"] and "noexec" in host["Tmpfs"]["/work"]
    assert not host.get("Binds") and not info.get("Mounts")  # nothing of the host, no docker socket
    assert host["IpcMode"] == "none" and host["LogConfig"]["Type"] == "none"
    labels = info["Config"]["Labels"]
    assert labels[LABEL] == "1" and labels[OWNER_LABEL] == owner
    assert labels[PROCESS_LABEL].startswith(f"{os.getpid()}:")


async def test_real_scoring_path(pool: DockerSandboxPool, registry: RewardRegistry):
    spec = RewardSpec(
        entry_point="add", tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]
    )
    good = await evaluate(
        pool, registry, spec, "Sure:\n```python\ndef add(a, b):\n    return a + b\n```", "g/0"
    )
    assert good.scored.reward == pytest.approx(2 / 3)
    assert (good.scored.execution.tests_passed, good.scored.execution.tests_total) == (2, 3)
    syntax = await evaluate(pool, registry, spec, "```python\ndef add(a, b):\n    return a +\n```", "g/1")
    record = syntax.scored.execution
    assert (record.error_kind, record.error_line, syntax.scored.reward) == (
        "syntax",
        2,
        spec.syntax_error_reward,
    )
    assert record.error_message.startswith("SyntaxError")
    indent = await evaluate(pool, registry, spec, "```python\ndef add(a, b):\nreturn a + b\n```", "g/2")
    assert indent.scored.execution.error_message.startswith("IndentationError")
    runtime = await evaluate(
        pool, registry, spec, "```python\nimport nope_missing\ndef add(a, b): pass\n```", "g/3"
    )
    assert (runtime.scored.execution.error_kind, runtime.scored.execution.error_line) == ("runtime", 1)
    assert "ModuleNotFoundError" in runtime.scored.execution.error_message
    nothing = await evaluate(pool, registry, spec, "I cannot help with that.\n```text\nno\n```", "g/4")
    assert nothing.result is None and nothing.scored.execution.error_kind == "no_code"
    main_guard = await evaluate(
        pool,
        registry,
        spec,
        "```python\ndef add(a, b):\n    return a + b\n"
        "if __name__ == '__main__':\n    print(add(int(input()), 1))\n```",
        "g/5",
    )
    assert main_guard.scored.reward == pytest.approx(2 / 3)  # the guard does not run; stdin is empty


async def test_executions_in_one_container_do_not_see_each_other(pool: DockerSandboxPool):
    leave = (
        "import os, sys, threading, time, json\n"
        "open('/work/left', 'w').write('x')\n"
        "os.environ['LEFT'] = '1'\n"
        "json.LEFT = 1\n"
        "sys.modules['planted'] = json\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    )
    first = await pool.execute(Job(job_id="a", code=leave))
    look = (
        "import os, sys, json, threading\n"
        "seen = [os.path.exists('/work/left'), 'LEFT' in os.environ, hasattr(json, 'LEFT'),\n"
        "        'planted' in sys.modules, threading.active_count()]\n"
    )
    second = await pool.execute(
        Job(job_id="b", code=look, tests=["assert seen == [False, False, False, False, 1], seen"])
    )
    assert first.sandbox_id == second.sandbox_id
    assert [e.get("ok") for e in second.events if e.get("e") == "test"] == [True]


async def test_many_reports_and_the_cheap_cleanup_check(pool: DockerSandboxPool, sandbox_runtime: str):
    # The runner does not wake up per report: a job whose reports overflow the pipe (64 KiB)
    # waits for the periodic drain, and still every report arrives.
    tests = [f"assert x == {i} - {i} + 1" for i in range(3000)]
    result = await pool.execute(Job(job_id="many", code="x = 1", tests=tests))
    passed = [e["i"] for e in result.events if e.get("e") == "test" and e.get("ok")]
    assert passed == list(range(3000)) and result.events[-1] == {"e": "done"}
    assert not result.violations and not result.recycled
    # The container's pids cgroup is readable, so a clean job is proved clean without /proc scans
    # (gVisor has none inside: a scan of /proc there)
    assert all(warm.ready.get("tasks_counted") == (sandbox_runtime == "runc") for warm in pool._all)


async def test_recycled_after_n_executions(sandbox_image: str, owner: str):
    config = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1, recycle_after=3)
    async with DockerSandboxPool(config) as pool:
        results = [await pool.execute(Job(job_id=str(i), code="x = 1")) for i in range(4)]
        assert [r.recycled for r in results] == [False, False, True, False]
        assert (
            len({r.sandbox_id for r in results[:3]}) == 1 and results[3].sandbox_id != results[0].sandbox_id
        )
        async def one_left() -> bool:
            return len(await containers_of(owner)) == 1

        await wait_until(one_left, "the retired container removed", timeout_s=15)
    assert await containers_of(owner) == []  # and closing removes the rest


async def test_concurrent_executions_use_the_whole_pool(sandbox_image: str, owner: str):
    config = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=2)
    async with DockerSandboxPool(config) as pool:
        jobs = [
            Job(job_id=str(i), code=f"import time\ntime.sleep(0.05)\nx = {i}", tests=[f"assert x == {i}"])
            for i in range(12)
        ]
        results = await asyncio.gather(*(pool.execute(job) for job in jobs))
        assert all(r.events[-2].get("ok") for r in results)
        assert len({r.sandbox_id for r in results}) == 2


async def test_orphans_of_dead_executors_are_removed_live_ones_kept(sandbox_image: str, owner: str):
    import aiodocker

    config = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1)
    async with DockerSandboxPool(config) as live, aiodocker.Docker() as docker:
        dead = await docker.containers.create(
            {
                "Image": sandbox_image,
                "Cmd": ["sleep", "60"],
                "Labels": {
                    LABEL: "1",
                    OWNER_LABEL: owner,
                    HOST_LABEL: live.labels()[HOST_LABEL],
                    PROCESS_LABEL: "999999999:1",
                },
            },
            name=f"{owner}-orphan",
        )
        other = await docker.containers.create(  # someone else's: never touched
            {
                "Image": sandbox_image,
                "Cmd": ["sleep", "60"],
                "Labels": {LABEL: "1", OWNER_LABEL: owner + "-other"},
            },
        )
        try:
            assert await remove_orphans(docker, owner) == 1
            names = [c["Names"][0] for c in await containers_of(owner)]
            assert f"/{owner}-orphan" not in names and len(names) == 1  # the live pool's container stays
            assert (await docker.containers.container(other.id).show())["Id"] == other.id
        finally:
            await other.delete(force=True)
            del dead


async def test_crashed_executor_leaves_no_container(sandbox_image: str, owner: str):
    script = (
        "import asyncio, sys\n"
        "from rollstream.consumers.executor.pool import DockerSandboxPool\n"
        "from rollstream.config import ExecutorConfig\n"
        "async def main():\n"
        f"    config = ExecutorConfig(image={sandbox_image!r}, owner={owner!r}, pool_size=2)\n"
        "    async with DockerSandboxPool(config):\n"
        "        print('up', flush=True)\n"
        "        await asyncio.sleep(120)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"up"
        assert len(await containers_of(owner)) == 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    while await containers_of(owner) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)  # StdinOnce: the runners see EOF, exit, and are auto-removed
    left = await containers_of(owner)
    if left:  # a daemon that keeps them: the next executor's start removes them
        async with DockerSandboxPool(ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1)):
            ids = {c["Id"] for c in await containers_of(owner)}
            assert not ids & {c["Id"] for c in left}


async def test_missing_image_is_a_sandbox_error(owner: str, sandbox_image: str):
    with pytest.raises(SandboxError, match="sandbox build"):
        async with DockerSandboxPool(ExecutorConfig(image="rollstream-sandbox:does-not-exist", owner=owner)):
            pass


async def test_score_file_two_files_and_pairs(
    tmp_path: Path, pool: DockerSandboxPool, registry: RewardRegistry
):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"task_id": "add", "prompt": "add", "reward": {"tests": ["assert add(1, 2) == 3"]}})
        + "\n"
        + json.dumps({"task_id": "neg", "prompt": "neg", "reward": {"tests": ["assert neg(1) == -1"]}})
        + "\n"
    )
    completions = tmp_path / "completions.jsonl"
    completions.write_text(
        json.dumps({"task_id": "neg", "completion": "```python\ndef neg(x):\n    return -x\n```", "id": "c1"})
        + "\n"
        + json.dumps({"task_id": "add", "completion": "```python\ndef add(a, b) return\n```"})
        + "\n"
        + json.dumps({"task_id": "missing", "completion": "x"})
        + "\n"
        + json.dumps("def neg(x):\n    return x")
        + "\n"  # bare string: pairs with task line 4 -> none there
    )
    out = tmp_path / "out.jsonl"
    with out.open("w") as f:
        counts = await score_file(
            Config(executor=pool.config), [str(tasks), str(completions)], f, backend=pool
        )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert counts["scored"] == 2 and counts["errors"] == 2
    assert (
        lines[0]["reward"] == 1.0 and lines[0]["id"] == "c1" and lines[0]["execution"]["error_kind"] == "none"
    )
    assert lines[1]["execution"]["error_kind"] == "syntax" and lines[1]["execution"]["error_line"] == 1
    assert "no task" in lines[2]["error"] and "error" in lines[3]

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps(
            {
                "task": {"task_id": "t", "prompt": "p", "reward": {"tests": ["assert f() == 1"]}},
                "completion": "def f():\n    return 1",
            }
        )
        + "\n"
    )
    out2 = tmp_path / "out2.jsonl"
    with out2.open("w") as f:
        await score_file(Config(executor=pool.config), [str(pairs)], f, backend=pool)
    verdict = json.loads(out2.read_text())
    assert verdict["reward"] == 1.0 and verdict["components"] == {"tests": 1.0, "format": 0.0, "length": 1.0}
    msgspec.json.decode(json.dumps(verdict["execution"]))


async def test_container_dying_while_idle_is_not_blamed_on_the_next_code(
    pool: DockerSandboxPool, registry: RewardRegistry
):
    import aiodocker

    (warm,) = list(pool._all)
    async with aiodocker.Docker() as docker:
        await docker.containers.container(warm.container.id).kill()

        async def gone() -> bool:
            try:
                info = await docker.containers.container(warm.container.id).show()
            except aiodocker.DockerError:
                return True  # auto-removed
            return not info["State"]["Running"]

        await wait_until(gone, "the killed container stopped", timeout_s=15)
    spec = RewardSpec(tests=["assert f() == 1"])
    evaluation = await evaluate(pool, registry, spec, "def f():\n    return 1", "idle/0")
    assert (evaluation.scored.execution.error_kind, evaluation.scored.reward) == ("none", 1.0)
    assert evaluation.result.sandbox_id != warm.sandbox_id


async def test_runtimes_the_engine_lacks_or_that_let_code_into_the_runner_are_refused(
        sandbox_image: str, owner: str, monkeypatch: pytest.MonkeyPatch):
    """An executor refuses a runtime dockerd has not registered, naming those it has. Under
    gVisor (registered by .ci/install) the jobs run under uids of their own; the same sandbox
    with everything under one uid (as under runc) is refused, because this gVisor lets a process
    open a non-dumpable same-uid process's descriptors: the runner's probe catches it. And
    `rollstream sandbox doctor` reports each runtime."""
    import aiodocker

    from rollstream.consumers.executor import hardening
    from rollstream.consumers.executor import pool as pool_module
    from rollstream.consumers.executor.doctor import doctor, report

    async with aiodocker.Docker() as docker:
        registered = set((await docker.system.info()).get("Runtimes") or {})
    config = ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1, runtime="runsc")
    checks = {c.runtime: c for c in await doctor(ExecutorConfig(image=sandbox_image, owner=owner))}
    assert checks["runc"].works and checks["runc"].execution_ms is not None and checks["runc"].kernel
    assert checks["runc"].egress == "works", checks["runc"].egress  # a proxy started, reached, the job's record
    text, status = report(list(checks.values()), "runc", as_json=False)
    assert status == 0 and "runc *" in text
    if "runsc" not in registered:
        assert not checks["runsc"].works and "not registered" in checks["runsc"].problem
        with pytest.raises(SandboxError, match="not registered with the Docker engine"):
            async with DockerSandboxPool(config):
                pass
        return
    assert checks["runsc"].works, checks["runsc"].problem
    assert checks["runsc"].kernel.startswith("4.4.0")  # what gVisor's kernel says it is
    assert checks["runsc"].egress == "works", checks["runsc"].egress  # registered with --host-uds=open
    hardened = hardening.hardened_config

    def one_uid(*args: object, **kwargs: object) -> dict:
        body = hardened(*args, **kwargs)
        body["User"], body["HostConfig"]["CapAdd"] = hardening.SANDBOX_USER, []
        return body

    monkeypatch.setattr(pool_module, "hardened_config", one_uid)  # what the pool creates its containers with
    with pytest.raises(SandboxError, match=r"open the runner's descriptors \(/proc/1/fd"):
        async with DockerSandboxPool(config):
            pass
    assert await containers_of(owner) == []
