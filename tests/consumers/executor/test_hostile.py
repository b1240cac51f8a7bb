"""Hostile code against the real Docker sandbox.

For each attack: the verdict and reward, an audit record, and then the NEXT execution in the
same pool (the same container when it was not recycled) sees a clean sandbox: no process but
the runner and itself, an empty and empty-able /work, no IPC objects, the fixed environment.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid

import pytest

from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import RewardRegistry
from rollstream.consumers.executor.score import Evaluation, audit_record, evaluate
from rollstream.schemas.events import RewardSpec, SandboxAudit
from tests.helpers import container_ended, container_processes, wait_until

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

TIMEOUT_S = 1.0
SPEC = RewardSpec(tests=["assert f(1) == 2"], timeout_s=TIMEOUT_S)  # for attacks that should time out
ROOMY_S = 5.0  # for attacks that should end by themselves (the machine may be loaded)
ROOMY = RewardSpec(tests=SPEC.tests, timeout_s=ROOMY_S)

PROBE = """
import ctypes, os
def ipc_objects():  # the kernel's own counts (SHM_INFO, MSG_INFO, SEM_INFO): gVisor has no /proc/sysvipc
    libc, info = ctypes.CDLL(None, use_errno=True), ctypes.create_string_buffer(256)
    ints = ctypes.cast(info, ctypes.POINTER(ctypes.c_int))
    return [ints[0] if libc.shmctl(0, 14, info) >= 0 else -1, ints[0] if libc.msgctl(0, 12, info) >= 0 else -1,
            ints[7] if libc.semctl(0, 0, 19, info) >= 0 else -1]
def state():
    procs = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    parents = {p: int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) for p in procs if p != 1}
    ipc = ipc_objects()
    vfs = os.statvfs("/work")
    return {"procs": procs, "parents": parents, "me": os.getpid(), "zygote": os.getppid(),
            "work": os.listdir("/work"), "ipc": ipc, "cwd": os.getcwd(), "free": vfs.f_bavail / vfs.f_blocks,
            "env": sorted(os.environ), "uid": os.getuid()}
"""
PROBE_TESTS = [
    "s = state()",
    # PID 1, the three zygotes (children of PID 1: candidate, judge, pytest files' judge), this
    # candidate and its judge (their children)
    "others = set(s['procs']) - {1, s['zygote'], s['me']}\n"
    "judges = [p for p in others if s['parents'][p] != 1]\n"
    "assert len(others) == 3 and len(judges) == 1 and s['parents'][s['zygote']] == 1, s['procs']\n"
    "assert s['parents'][s['parents'][judges[0]]] == 1, s['parents']",
    "assert s['work'] == [], s['work']",
    "assert s['ipc'] == [0, 0, 0], s['ipc']",
    "assert s['free'] > 0.99, s['free']",
    "assert s['env'] == ['HOME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR'], s['env']",
    "assert (s['cwd'], s['uid']) == ('/work', 65534), (s['cwd'], s['uid'])",
]


async def attack(
    pool: DockerSandboxPool, registry: RewardRegistry, code: str, spec: RewardSpec = SPEC
) -> tuple[Evaluation, SandboxAudit]:
    evaluation = await evaluate(
        pool, registry, spec, f"```python\n{code}\n```", f"hostile/{uuid.uuid4().hex[:6]}"
    )
    audit = audit_record(evaluation, pool.limits, "hostile/0", time.time())
    assert audit is not None, "every execution has an audit record"
    assert audit.verdict == evaluation.scored.execution.error_kind
    assert audit.sandbox_id == evaluation.result.sandbox_id
    return evaluation, audit


async def assert_clean(pool: DockerSandboxPool, registry: RewardRegistry, after: Evaluation) -> None:
    """The next execution in the pool sees a clean sandbox (the same one unless recycled)."""
    spec = RewardSpec(tests=PROBE_TESTS, timeout_s=5.0)
    probe = await evaluate(pool, registry, spec, PROBE, "probe/0")
    failed = [e for e in probe.result.events if e.get("e") == "test" and not e.get("ok")]
    assert probe.scored.reward == 1.0, (failed, probe.scored.execution)
    if not after.result.recycled:
        assert probe.result.sandbox_id == after.result.sandbox_id  # the runner itself cleaned up
    else:
        assert probe.result.sandbox_id != after.result.sandbox_id


def expect(evaluation: Evaluation, kind: str, reward: float) -> None:
    record = evaluation.scored.execution
    failed = [(t.index, t.outcome, t.message) for t in record.test_results if t.outcome != "passed"]
    assert (record.error_kind, evaluation.scored.reward) == (kind, reward), (record.error_message, failed, record)


async def test_fork_bomb(pool, registry):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    evaluation, audit = await attack(pool, registry, code)
    expect(evaluation, "timeout", SPEC.timeout_reward)
    assert evaluation.result.duration_s < TIMEOUT_S + 2
    await assert_clean(pool, registry, evaluation)


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(1 << 40)",
        "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))",
    ],
    ids=["one-huge", "gradual"],
)
async def test_memory_bomb(pool, registry, code):
    # a roomier limit: zero-filling 256 MB takes a while on a loaded machine
    evaluation, _ = await attack(pool, registry, code, RewardSpec(tests=SPEC.tests, timeout_s=10.0))
    expect(evaluation, "oom", SPEC.crash_reward)
    assert evaluation.scored.execution.oom
    await assert_clean(pool, registry, evaluation)


async def test_memory_bomb_across_processes_hits_the_container_limit(pool, registry):
    # Each process stays under its own address-space limit; together they exceed the cgroup's.
    code = (
        "import os, time\n"
        "for _ in range(6):\n"
        "    if os.fork() == 0:\n"
        "        b = bytearray(200 << 20)\n"
        "        for i in range(0, len(b), 4096): b[i] = 1\n"
        "        time.sleep(30)\n"
        "time.sleep(30)"
    )
    evaluation, audit = await attack(pool, registry, code)
    assert evaluation.scored.execution.error_kind in ("oom", "timeout")
    assert evaluation.scored.reward in (SPEC.crash_reward, SPEC.timeout_reward)
    await assert_clean(pool, registry, evaluation)


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import time\ntime.sleep(100)",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n    time.sleep(0.1)",
        "import os, signal, time\nif os.fork() == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    os.setsid()\n    time.sleep(100)\nos.wait()",
    ],
    ids=["busy-loop", "sleep", "ignores-sigterm", "child-ignores-sigterm"],
)
async def test_runs_past_the_timeout(pool, registry, code):
    started = time.monotonic()
    evaluation, audit = await attack(pool, registry, code)
    expect(evaluation, "timeout", SPEC.timeout_reward)
    assert evaluation.scored.execution.timed_out
    assert time.monotonic() - started < TIMEOUT_S + 3  # killed, not waited for
    await assert_clean(pool, registry, evaluation)


async def test_child_outlives_parent(pool, registry):
    code = (  # the parent waits until the grandchild has left its session (else the job's end may
        # kill the group before the child's setsid, and there is nothing left to find)
        "import os, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.write(w, b'x')\n"
        "        time.sleep(0.5)\n"
        "        open('/work/late', 'w').write('still here')\n"
        "        time.sleep(100)\n"
        "    os._exit(0)\n"
        "os.read(r, 1)\n"
        "def f(x):\n    return x + 1\n"
    )
    evaluation, audit = await attack(pool, registry, code, ROOMY)
    expect(evaluation, "violation", SPEC.crash_reward)
    assert any(v.startswith("stray_processes") for v in audit.violations)
    assert audit.recycled
    # the orphan cannot write anywhere once its container has ended: wait for that, not for a time
    await wait_until(lambda: container_ended(evaluation.result.container_id), "the attacked container ended", 30)
    await assert_clean(pool, registry, evaluation)


async def test_zombie_left_behind_is_reaped_without_blame(pool, registry):
    # Not a survivor (it has exited), but it keeps the cgroup's task count up: the runner must
    # notice, reap it and find the container clean.
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "while open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':\n"
        "    time.sleep(0.001)\n"
        "def f(x):\n    return x + 1\n"
    )
    evaluation, audit = await attack(pool, registry, code, ROOMY)
    expect(evaluation, "none", 1.0)
    assert not audit.violations and not audit.recycled
    await assert_clean(pool, registry, evaluation)


async def test_flooding_every_descriptor_it_holds(pool, registry):
    # The code holds no report channel (the judge reports); what it can write to is its stdout,
    # stderr and its reply pipe to the judge. Junk on the reply pipe is tamper, found at once by
    # the judge; the flood on stdout hits the output cap in the runner: whichever comes first.
    code = (
        "import os\n"
        "fds = []\n"
        "for fd in range(1, 256):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "        fds.append(fd)\n"
        "    except OSError:\n"
        "        pass\n"
        "line = b'x' * 4095 + b'\\n'\n"
        "while True:\n"
        "    for fd in fds:\n"
        "        try:\n"
        "            os.write(fd, line)\n"
        "        except OSError:\n"
        "            pass\n"
    )
    started = time.monotonic()
    evaluation, audit = await attack(pool, registry, code, ROOMY)
    record = evaluation.scored.execution
    assert record.error_kind in ("tamper", "output_limit") and evaluation.scored.reward == SPEC.crash_reward, record
    assert record.tamper in ("protocol", "") and audit.verdict == record.error_kind
    assert time.monotonic() - started < ROOMY_S  # stopped at the cap, not at the deadline
    await assert_clean(pool, registry, evaluation)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_gigabyte_of_output(pool, registry, stream):
    code = f"import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.{stream}.write(chunk)"
    started = time.monotonic()
    evaluation, audit = await attack(pool, registry, code, ROOMY)
    expect(evaluation, "output_limit", SPEC.crash_reward)
    record = evaluation.scored.execution
    assert len(record.stdout_tail) <= 4000 and len(record.stderr_tail) <= 4000
    assert pool.limits.output_bytes < audit.output_bytes < 16 << 20  # stopped right after the cap
    assert time.monotonic() - started < ROOMY_S  # stopped at the cap, not at the deadline
    await assert_clean(pool, registry, evaluation)


async def test_files_in_dev_shm_do_not_outlive_their_job(pool, registry):
    """/dev/shm is writable (multiprocessing's semaphores live there) and wiped after every job."""
    leave = "open('/dev/shm/left', 'w').write('x' * 1000)\nimport os\nos.mkdir('/dev/shm/d')\ndef f(x):\n    return x + 1\n"
    spec = RewardSpec(tests=["assert f(1) == 2"], timeout_s=ROOMY_S)
    for _ in range(3):  # the pool has two containers: each gets a turn
        evaluation, _ = await attack(pool, registry, leave, spec)
        expect(evaluation, "none", 1.0)
        look = "import os\ndef f(x):\n    return len(os.listdir('/dev/shm')) + x + 1\n"
        evaluation, _ = await attack(pool, registry, look, RewardSpec(tests=["assert f(1) == 2"], timeout_s=ROOMY_S))
        expect(evaluation, "none", 1.0)


async def test_writes_outside_the_work_dir_fail(pool, registry):
    code = (
        "import os\n"
        "targets = ['/etc/pwned', '/tmp/pwned', '/pwned', '/usr/lib/python3/pwned.py', '/var/tmp/pwned',\n"
        "           '/home/pwned', '/run/pwned', '/proc/pwned', '/sys/pwned']\n"
        "written = []\n"
        "for path in targets:\n"
        "    try:\n"
        "        with open(path, 'w') as f:\n"
        "            f.write('x')\n"
        "        written.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "def f(x):\n    return x + 1\n"
    )
    spec = RewardSpec(tests=["assert written == [], written", "assert f(1) == 2"], timeout_s=ROOMY_S)
    evaluation, _ = await attack(pool, registry, code, spec)
    expect(evaluation, "none", 1.0)
    # uncaught: the write fails, the code dies with a runtime error, all tests fail
    evaluation, _ = await attack(
        pool, registry, "open('/etc/passwd', 'a').write('x')\ndef f(x):\n    return x + 1", ROOMY
    )
    expect(evaluation, "runtime", 0.0)
    assert (
        "OSError" in evaluation.scored.execution.error_message
        or "Error" in evaluation.scored.execution.error_message
    )
    await assert_clean(pool, registry, evaluation)


async def test_filling_the_work_dir(pool, registry):
    code = (
        "import os\n"
        "os.makedirs('/work/d/e', exist_ok=True)\n"
        "with open('/work/d/e/big', 'wb') as f:\n"
        "    while True:\n"
        "        f.write(b'0' * (1 << 20))\n"
    )
    evaluation, _ = await attack(pool, registry, code, ROOMY)
    expect(evaluation, "runtime", 0.0)
    assert (
        "No space left" in evaluation.scored.execution.error_message
        or "too large" in evaluation.scored.execution.error_message
    )
    # and an undeletable tree: the runner restores permissions before wiping
    evaluation, _ = await attack(
        pool,
        registry,
        "import os\nos.makedirs('/work/a/b')\nopen('/work/a/b/c', 'w')\n"
        "os.chmod('/work/a/b', 0)\nos.chmod('/work/a', 0)\ndef f(x):\n    return x + 1",
        ROOMY,
    )
    expect(evaluation, "none", 1.0)
    await assert_clean(pool, registry, evaluation)


async def test_network_is_unreachable(pool, registry):
    try:  # the loopback case means most when something listens on the host's 127.0.0.1:6379
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
        host_service = True
    except OSError:
        host_service = False
    code = (
        "import socket\n"
        "results = {}\n"
        "for target in [('1.1.1.1', 53), ('8.8.8.8', 443), ('127.0.0.1', 6379), ('172.17.0.1', 6379)]:\n"
        "    try:\n"
        "        socket.create_connection(target, timeout=0.5).close()\n"
        "        results[target] = 'connected'\n"
        "    except OSError as exc:\n"
        "        results[target] = type(exc).__name__\n"
        "try:\n"
        "    socket.getaddrinfo('example.com', 80)\n"
        "    results['dns'] = 'resolved'\n"
        "except OSError as exc:\n"
        "    results['dns'] = type(exc).__name__\n"
        "interfaces = [name for _, name in socket.if_nameindex()]\n"
    )
    tests = [
        "assert 'connected' not in results.values() and 'resolved' not in results.values(), results",
        "assert interfaces == ['lo'], interfaces",
    ]
    evaluation, _ = await attack(pool, registry, code, RewardSpec(tests=tests, timeout_s=ROOMY_S))
    expect(evaluation, "none", 1.0)
    if not host_service:
        pytest.xfail("nothing listens on the host's 127.0.0.1:6379; the loopback case proved less")
    await assert_clean(pool, registry, evaluation)


async def test_host_environment_and_files_are_invisible(pool, registry, tmp_path):
    secret = uuid.uuid4().hex
    os.environ["ROLLSTREAM_TEST_SECRET"] = secret  # in the executor's own environment
    (tmp_path / "secret.txt").write_text(secret)
    try:
        code = (
            "import os\n"
            f"secret = {secret!r}\n"
            f"host_file = {str(tmp_path / 'secret.txt')!r}\n"
            "seen = []\n"
            "if any(secret in v for v in os.environ.values()): seen.append('environ')\n"
            "for path in ['/proc/self/environ', '/proc/1/environ', '/proc/1/cmdline', host_file,\n"
            "             '/var/run/docker.sock', '/run/docker.sock', '/root/.docker/config.json']:\n"
            "    try:\n"
            "        if secret.encode() in open(path, 'rb').read(): seen.append(path)\n"
            "    except OSError:\n"
            "        pass\n"
            "sockets = [p for p in ['/var/run/docker.sock', '/run/docker.sock'] if os.path.exists(p)]\n"
            "mounts = open('/proc/self/mounts').read()\n"
        )
        tests = [
            "assert seen == [], seen",
            "assert sockets == [], sockets",
            "assert ' /work tmpfs ' in mounts and 'docker.sock' not in mounts, mounts",
            "assert not os.path.exists(host_file)",
        ]
        evaluation, _ = await attack(pool, registry, code, RewardSpec(tests=tests, timeout_s=ROOMY_S))
        expect(evaluation, "none", 1.0)
    finally:
        del os.environ["ROLLSTREAM_TEST_SECRET"]
    await assert_clean(pool, registry, evaluation)


async def test_the_runners_environment_reads_as_nothing(pool, registry):
    """The environment PID 1 was started with (the pool's limits, the proxy socket's path) is the
    executor's: under runc /proc refuses it (PID 1, the zygotes and the judge are non-dumpable);
    gVisor's kernel lets any process read another's environ, so PID 1 overwrites its own before it
    forks anything (runtime/supervisor.py _scrub_environ): there it reads as NUL bytes only."""
    code = (
        "import os\n"
        "seen = {}\n"
        "for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):\n"
        "    if pid == os.getpid():\n"
        "        continue\n"
        "    try:\n"
        "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if data.strip(b'\\0'):\n"
        "        seen[pid] = data[:200]\n"
        "def f(x):\n    return x + 1\n"
    )
    tests = ["assert seen == {}, seen", *SPEC.tests]
    evaluation, _ = await attack(pool, registry, code, RewardSpec(tests=tests, timeout_s=ROOMY_S))
    expect(evaluation, "none", 1.0)
    await assert_clean(pool, registry, evaluation)


async def test_proc_tricks_fail(pool, registry, sandbox_runtime):
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "worked = []\n"
        "def attempt(name, fn):\n"
        "    try:\n"
        "        fn()\n"
        "        worked.append(name)\n"
        "    except OSError:\n"
        "        pass\n"
        "def write(path, data):  # unbuffered, so that a refused write raises here\n"
        "    fd = os.open(path, os.O_WRONLY)\n"
        "    try:\n"
        "        os.write(fd, data)\n"
        "    finally:\n"
        "        os.close(fd)\n"
        "attempt('read runner memory', lambda: open('/proc/1/mem', 'rb').read(1))\n"
        "attempt('runner fds', lambda: os.listdir('/proc/1/fd'))\n"
        "attempt('runner stdout', lambda: write('/proc/1/fd/1', b'{\"forged\": 1}\\n'))\n"
        "attempt('sysrq', lambda: write('/proc/sysrq-trigger', b'b'))\n"
        "attempt('hostname', lambda: write('/proc/sys/kernel/hostname', b'x'))\n"
        "attempt('oom protect', lambda: write('/proc/self/oom_score_adj', b'-1000'))\n"
        "attempt('runner oom', lambda: write('/proc/1/oom_score_adj', b'1000'))\n"
        "attempt('kcore', lambda: open('/proc/kcore', 'rb').read(1) or (_ for _ in ()).throw(OSError()))\n"
        "attempt('kmsg', lambda: open('/proc/kmsg', 'rb').read(1))\n"
        "if libc.ptrace(16, 1, None, None) == 0: worked.append('ptrace runner')  # PTRACE_ATTACH\n"
        "if libc.shmget(0, 4096, 0o1600) >= 0: worked.append('sysv shm')  # would outlive the job\n"
        "if libc.msgget(0, 0o1600) >= 0: worked.append('sysv msg')\n"
        "if libc.semget(0, 1, 0o1600) >= 0: worked.append('sysv sem')\n"
        "if libc.mq_open(b'/q', 0o100 | 0o2, 0o600, None) >= 0: worked.append('posix mqueue')\n"
        "if libc.setuid(0) == 0: worked.append('setuid')\n"
        "if libc.unshare(0x10000000) == 0: worked.append('unshare user ns')\n"
        "if libc.mount(b'none', b'/work', b'tmpfs', 0, None) == 0: worked.append('mount')\n"
    )
    # gVisor's kernel lists the numbers of PID 1's descriptors (none can be opened: another uid's)
    # and keeps an oom_score_adj of its own that no host OOM killer reads
    harmless = ["runner fds", "oom protect"] if sandbox_runtime == "runsc" else []
    evaluation, _ = await attack(
        pool, registry, code,
        RewardSpec(tests=[f"assert set(worked) <= set({harmless!r}), worked"], timeout_s=ROOMY_S),
    )
    expect(evaluation, "none", 1.0)
    await assert_clean(pool, registry, evaluation)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 is an x86_64 ABI")
async def test_a_call_through_another_abi_kills_its_process(pool, registry, sandbox_runtime):
    # The runner's own seccomp filter (runtime/cleanup.py seccomp_program): the 32-bit entry
    # points reach the same IPC objects under other numbers, so a call through one ends the process
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.syscall(0x40000000 | 29, 0, 4096, 0o1600)  # shmget, the x32 way\n"
            "def f(x):\n    return x + 1\n")
    evaluation, _ = await attack(pool, registry, code, ROOMY)
    if sandbox_runtime == "runsc":  # gVisor has no x32 entry points of its own: the call fails either way
        assert evaluation.scored.reward <= 0 and not evaluation.scored.execution.passed
    else:
        expect(evaluation, "crash", ROOMY.crash_reward)
        assert "signal 31" in evaluation.scored.execution.error_message  # SIGSYS
    await assert_clean(pool, registry, evaluation)


async def test_no_other_process_descriptor_opens_through_proc(pool, registry):
    """The judge's part of the job (its tests) sits in PID 1's in-memory file, the verdicts on
    pipes of PID 1's and the judge's: through /proc/<pid>/fd the code opens none of them (runc:
    they are non-dumpable; runsc: another uid's, and the parts 0600). What it may open there is
    what it could open by a path of its own, with the same access: a file of the image anyone
    may read by its path (under runsc the pytest zygote, root's, may be importing pytest while a job runs,
    and gVisor checks such a reopen against the file's mode alone) or /dev/null; never a
    pipe, a socket, an in-memory or deleted file."""
    code = (
        "import os, stat\n"
        "opened = []\n"
        "null, image = os.stat('/dev/null'), os.stat('/usr').st_dev\n"
        "for pid in (p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()):\n"
        "    try:\n"
        "        fds = os.listdir(f'/proc/{pid}/fd')\n"
        "    except OSError:\n"
        "        continue\n"
        "    for fd in fds:\n"
        "        path = f'/proc/{pid}/fd/{fd}'\n"
        "        for mode, anyone in ((os.O_RDONLY, stat.S_IROTH), (os.O_WRONLY, stat.S_IWOTH)):\n"
        "            try:\n"
        "                held = os.open(path, mode)\n"
        "            except OSError:\n"
        "                continue\n"
        "            st = os.fstat(held)\n"
        "            os.close(held)\n"
        "            public = (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino) or (\n"
        "                stat.S_ISREG(st.st_mode) and st.st_dev == image and st.st_nlink > 0)\n"
        "            if not (public and st.st_mode & anyone):\n"
        "                try:\n"
        "                    target = os.readlink(path)\n"
        "                except OSError:\n"
        "                    target = '?'\n"
        "                opened.append((pid, fd, target, oct(st.st_mode), st.st_uid, st.st_nlink))\n"
        "def f(x):\n    return x + 1\n"
    )
    evaluation, _ = await attack(
        pool, registry, code, RewardSpec(tests=["assert opened == [], opened", "assert f(1) == 2"], timeout_s=ROOMY_S)
    )
    expect(evaluation, "none", 1.0)
    await assert_clean(pool, registry, evaluation)


async def test_signals_to_the_runner_are_ignored(pool, registry):
    code = (
        "import os, signal\n"
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP, signal.SIGSEGV):\n"
        "    try:\n"
        "        os.kill(1, sig)\n"
        "    except OSError:\n"
        "        pass\n"
        "def f(x):\n    return x + 1\n"
    )
    evaluation, audit = await attack(pool, registry, code, ROOMY)
    # runc: PID 1 ignores in-namespace signals it has no handler for; runsc (whose kernel does not
    # protect init): PID 1 is another uid's than the job's, the signals are refused
    expect(evaluation, "none", 1.0)
    assert not audit.recycled  # the runner survived, verified itself clean, and keeps serving
    await assert_clean(pool, registry, evaluation)


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.kill(os.getppid(), 9)\nimport time\ntime.sleep(0.5)",
        "import os\nos.kill(-1, 9)\nimport time\ntime.sleep(0.5)",
        "import os\nos.kill(os.getppid(), 19)\nimport time\ntime.sleep(0.5)",  # SIGSTOP
    ],
    ids=["kill-zygote", "kill-everyone", "stop-zygote"],
)
async def test_killing_the_process_that_forked_the_job(pool, registry, code, sandbox_runtime):
    """The job's parent is the runner's zygote, which the code can signal under runc: that is a
    violation, the runner kills everything itself and the container is replaced. Under runsc the
    zygote is root's: the signal is refused (kill(-1) reaches only the uid's processes: the job's
    own and its judge, a violation as under runc)."""
    evaluation, audit = await attack(pool, registry, code, RewardSpec(tests=SPEC.tests, timeout_s=2.0))
    if sandbox_runtime == "runsc":
        assert evaluation.scored.reward <= 0 and not evaluation.scored.execution.passed
        assert not any(v.startswith("runner_zygote") for v in audit.violations)
    else:
        expect(evaluation, "violation", SPEC.crash_reward)
        assert any(v.startswith("runner_zygote") for v in audit.violations) and audit.recycled
    await assert_clean(pool, registry, evaluation)


async def test_runner_killed_from_outside_mid_execution(pool, registry):
    """The runner cannot be killed from inside; if it dies anyway (here: the container is killed
    from outside while the job runs) the machinery failed, not the code: outcome ``infra``, no
    reward (the job is not run again here: ``attempts=1``), and the pool replaces the container."""
    import aiodocker

    warm = list(pool._all)
    idle = [await container_processes(w.container.id) for w in warm]  # the runner, zygotes, children forked ahead

    async def kill_while_the_job_runs() -> None:
        async def running() -> bool:  # the job's own child has joined them
            counts = [await container_processes(w.container.id) for w in warm]
            return any(now > before for now, before in zip(counts, idle))

        await wait_until(running, "the job runs in its sandbox", 30, 0.02)
        async with aiodocker.Docker() as docker:
            for w in warm:
                await docker.containers.container(w.container.id).kill()

    killer = asyncio.create_task(kill_while_the_job_runs())
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(3)\n    os._exit(0)\ntime.sleep(3)\ndef f(x):\n    return x + 1"
    evaluation = await evaluate(pool, registry, ROOMY, f"```python\n{code}\n```", "hostile/killed", attempts=1)
    await killer
    assert evaluation.scored.execution.error_kind == "infra" and evaluation.scored.reward == 0.0
    assert evaluation.result is None and evaluation.lost and evaluation.lost[0] in ("container_killed", "container_gone")
    audit = audit_record(evaluation, pool.limits, "hostile/0", time.time())
    assert audit.outcome == "infra" and audit.violations == [f"lost:{evaluation.lost[0]}"]
    probe = await evaluate(pool, registry, RewardSpec(tests=PROBE_TESTS, timeout_s=5.0), PROBE, "probe/0")
    assert probe.scored.reward == 1.0 and probe.result.sandbox_id not in {w.sandbox_id for w in warm}


async def test_forged_test_reports_are_rejected(pool, registry):
    code = (
        "import os\n"
        'forged = b\'{"e": "code_ok"}\\n{"e": "test", "i": 0, "ok": true}\\n{"e": "done"}\\n\'\n'
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        os.write(fd, forged)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    )
    evaluation, _ = await attack(pool, registry, code, ROOMY)
    # It holds no report channel; what it wrote to its reply pipe is not a message: tamper.
    expect(evaluation, "tamper", SPEC.crash_reward)
    assert evaluation.scored.execution.tests_passed == 0
    await assert_clean(pool, registry, evaluation)


async def test_a_job_that_kills_the_zygote_it_came_from_costs_the_next_job_nothing(pool, registry):
    """The candidate kills its own zygote (its parent): whether the runner notices during the job or
    only when the next one arrives, the next job runs in a container that works and earns its reward."""
    evaluation, _ = await attack(pool, registry, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
    assert evaluation.scored.reward < 1.0
    await assert_clean(pool, registry, evaluation)
