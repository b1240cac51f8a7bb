"""Sandbox backend: a warm pool of hardened Docker containers, each running the fork-per-job runner.

Consumes :class:`Job` s (code + setup + tests + limits); produces :class:`RunResult` s (what
happened, with the violations seen). Guarantees:

* Every container is created with :func:`hardened_config`: no network, read-only root, a
  size-capped tmpfs ``/work`` (noexec) and a small one at ``/dev/shm`` (multiprocessing's
  semaphores), all capabilities dropped, no-new-privileges, uid 65534, pids/memory/CPU limits,
  no IPC namespace sharing, no mounts of the host,
  no Docker socket, logging off (output only travels over the attach stream, capped).
* Each execution runs in fresh processes forked by the in-container runner's zygotes
  (``consumers/executor/runtime/supervisor.py``, ``zygotes.py``: a judge and a candidate) with a hard
  wall-clock limit enforced twice: by the runner (SIGKILL of every process in the container) and
  by this host side (the container is killed when the runner does not answer in time).
* A container is reused only while the runner reports it clean (no process left, empty
  ``/work``, no IPC objects) and no violation happened; otherwise, and after ``recycle_after``
  executions, it is retired and a fresh one replaces it in the background.
* Containers carry the labels ``rollstream.sandbox=1``, ``rollstream.sandbox.owner=<owner>`` and
  the executor's host and process; at start the pool removes containers of its owner whose
  executor process is gone (a crashed executor). Containers also stop by themselves when their
  executor disconnects (``StdinOnce``) and are then auto-removed.
* A job with assets (``RewardSpec.assets``, consumers/executor/assets.py) runs in a pool keyed by its
  set of assets: started when a task first asks for the set, its containers mount the set's volume
  read-only at ``/assets``, retired with its volume after ``executor.keyed_pool_idle_s`` idle. Jobs
  without assets never wait on it: they take the warm pool as before.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import builtins
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import secrets
import socket
import sys
import time
from importlib import resources
from typing import Any, Literal, Protocol

import msgspec

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.assets import AssetCache, archive, set_key
from rollstream.consumers.executor.egress import (
    READY_TIMEOUT_S as PROXY_READY_TIMEOUT_S,
)
from rollstream.consumers.executor.egress import (
    SOCKET,
    EgressProxy,
    check_allowed,
    network_key,
    proxy_config,
    socket_dir_archive,
)
from rollstream.consumers.executor.image import PYTEST_LABEL
from rollstream.consumers.executor.runtime import importer
from rollstream.consumers.executor.runtime.candidate import SOLUTION
from rollstream.errors import SandboxError, SandboxLost
from rollstream.retry import retry
from rollstream.schemas.events import Asset, SandboxLimits

log = logging.getLogger(__name__)

LABEL = "rollstream.sandbox"
OWNER_LABEL = "rollstream.sandbox.owner"
HOST_LABEL = "rollstream.sandbox.host"
PROCESS_LABEL = "rollstream.sandbox.process"
SANDBOX_USER = "65534:65534"
RUNNER_OVERHEAD_MB = 128  # the runner, its zygotes, the judge and the forked interpreters' own pages
# Under runsc the container's cgroups hold gVisor itself: its pids cgroup counts gVisor's host
# threads and, on the ptrace platform, a stub per address space (~60 at start, thousands under a
# fork bomb), not the sandbox's processes, so it gets a bound of its own; the sandbox's processes
# are bounded inside gVisor's kernel by RLIMIT_NPROC, which the runner sets to ``executor.pids``
# (under runc that limit would count every process of uid 65534 on the host). Its memory cgroup
# holds gVisor's kernel too: RUNSC_OVERHEAD_MB more.
RUNSC_HOST_TASKS = 4096
RUNSC_OVERHEAD_MB = 384  # a fork bomb peaked at 471-630 MB of 640 with 256 (2026-12-05, 10 runs)
# Under runsc PID 1 starts as root with these capabilities only (gVisor's root, not the host's) and
# each job's process drops to 65534 (runtime/zygotes.py JOB_IDS): gVisor's kernel
# lets a same-uid process open a non-dumpable one's descriptors and signal its namespace's init,
# which runc's does not. SETUID/SETGID: the drop; KILL: ending the jobs' processes; DAC_OVERRIDE,
# FOWNER: wiping what they left in /work; CHOWN: an episode's files restored as the candidate's.
RUNSC_CAPS = ["SETUID", "SETGID", "KILL", "DAC_OVERRIDE", "FOWNER", "CHOWN"]
TAIL_BYTES = 4000  # fits ExecutionRecord's ShortText tails
ASSETS = "/assets"  # where a keyed pool's set of assets is mounted, read-only
WORKSPACE_BYTES = 256 << 10  # an episode's files carried between turns, at most
SHM = "/dev/shm"
SHM_MB = 16  # multiprocessing's semaphores and queues (a tmpfs of its own, wiped after every job)
READY_TIMEOUT_S = 60.0
# Names a test never takes from the completion: the judge's builtins and its helpers.
JUDGE_NAMES = frozenset(dir(builtins)) | {"raises", "run_program", "__assert_explain__"}  # the judge's own


class Job(msgspec.Struct, frozen=True, kw_only=True):
    """One program to run: ``setup``, then ``code`` (as ``<completion>``), then each test.

    With ``trust = "judge"`` the tests run in a judge process of their own and reach the
    completion only through the names in ``names`` (those the tests read that the completion
    may define; ``entry_point`` always among them); ``modules`` are the standard-library modules
    the tests read by name without importing them (the judge imports them itself, before the
    completion runs); ``rules`` what the task's reference says about what may cross
    (consumers/executor/runtime/crossing.py ``Rules``: ``{"mode": "record"}`` on the reference itself;
    ``{}``, a task without one, the strictest reading). See consumers/executor/runtime/judge.py. With
    ``program`` the code is a whole program: tests call ``run_program(stdin)`` for its standard output."""

    job_id: str
    code: str
    setup: str = ""
    tests: list[str] = []
    timeout_s: float = 5.0
    memory_mb: int = 256
    entry_point: str = ""
    names: list[str] = []
    modules: list[str] = []
    program: bool = False
    pytest: bool = False  # each test a pytest file (runtime/pytests.py)
    trust: Literal["judge", "in_process"] = "judge"
    rules: dict[str, Any] = {}
    files: list[tuple[str, bytes]] = []  # an episode's workspace, written into /work before the code runs
    collect_files: bool = False  # return the files the job left in /work (the next turn's workspace)
    assets: list[Asset] = []  # read-only under /assets: the job runs in the pool keyed by this set
    network: list[str] = []  # hosts reachable through the egress proxy: the pool is keyed by these too
    test_hook: str | None = None  # tests only (a pool started with test_hooks): code run in the judge first
    # tests only (a pool started with test_hooks): make the runner fail on purpose, one of
    # RUNNER_HOOKS (runtime/supervisor.py)
    runner_hook: str | None = None

    def __post_init__(self) -> None:
        if not self.names:
            msgspec.structs.force_setattr(self, "names", list(tested_names(tuple(self.tests), self.entry_point)))
        if not self.modules:
            msgspec.structs.force_setattr(self, "modules", list(tested_modules(tuple(self.tests))))


@functools.lru_cache(maxsize=4096)
def tested_names(tests: tuple[str, ...], entry_point: str = "") -> tuple[str, ...]:
    """The names the tests read that the completion may define (the judge binds those the
    task's setup does not define): every name loaded anywhere in a test, but the judge's
    builtins and helpers and the names the tests bind themselves (``result = f(1)``: a global of
    the completion's called ``result`` is not the tests' result, even where their assignment did
    not run); the entry point always; and the names the tests take from the completion's module
    (``from solution import add``, ``solution.add`` after ``import solution``, and what the tests
    patch there: ``mock.patch("solution.helper")``, ``monkeypatch.setattr(solution, "helper", ...)``).
    Cached: a group shares its tests."""
    loaded, bound = _loaded_and_bound(tests)
    names = (loaded - bound) | ({entry_point} if entry_point else set()) | _from_solution(tests)
    return tuple(sorted(n for n in names if n == entry_point or n not in JUDGE_NAMES))


@functools.lru_cache(maxsize=4096)
def _from_solution(tests: tuple[str, ...]) -> frozenset[str]:
    """The names the tests import from the completion's module, or read as attributes of it."""
    found: set[str] = set()
    for tree in _trees(tests):
        aliases = set()  # what `import solution [as s]` binds
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == SOLUTION and not node.level:
                found.update(a.name for a in node.names if a.name != "*")
            elif isinstance(node, ast.Import):
                aliases.update(a.asname or a.name for a in node.names if a.name == SOLUTION)
        for node in ast.walk(tree):  # patch targets: mock.patch("solution.helper"), monkeypatch's string form
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                module, dot, rest = node.value.partition(".")
                name = rest.partition(".")[0]
                if module == SOLUTION and dot and name.isidentifier():
                    found.add(name)
        if aliases:
            found.update(node.attr for node in ast.walk(tree)
                         if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                         and node.value.id in aliases)
            # mock.patch.object(solution, "helper"), monkeypatch.setattr(solution, "helper", ...), getattr(...)
            found.update(node.args[1].value for node in ast.walk(tree)
                         if isinstance(node, ast.Call) and len(node.args) >= 2
                         and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
                         and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                         and node.args[1].value.isidentifier())
    return frozenset(found)


@functools.lru_cache(maxsize=4096)
def tested_modules(tests: tuple[str, ...]) -> tuple[str, ...]:
    """Standard-library modules the tests read by name but never bind themselves (``math`` in
    ``assert math.isclose(f(2), 1.41)``, relying on the completion's ``import math``): the judge
    imports these itself, before the completion runs, and binds nothing else to a module."""
    loaded, bound = _loaded_and_bound(tests)
    return tuple(sorted(n for n in loaded - bound if n in sys.stdlib_module_names))


@functools.lru_cache(maxsize=4096)
def _loaded_and_bound(tests: tuple[str, ...]) -> tuple[frozenset[str], frozenset[str]]:
    """(the names the tests read, the names they bind: assignments, imports, definitions)."""
    loaded, bound = set(), set()
    for tree in _trees(tests):
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).partition(".")[0])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
    return frozenset(loaded), frozenset(bound)


def _trees(tests: tuple[str, ...]) -> list[ast.AST]:
    trees = []
    for source in tests:
        try:
            trees.append(ast.parse(source))
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue  # the judge reports the broken test
    return trees


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one execution did. ``events`` are the harness's reports (see runner.harness)."""

    sandbox_id: str
    container_id: str
    exit_code: int | None = None
    signal: int | None = None
    duration_s: float = 0.0
    timed_out: bool = False
    output_limit: bool = False
    oom_killed: bool = False
    output_bytes: int = 0
    stdout_tail: str = ""
    stderr_tail: str = ""
    events: list[dict[str, Any]] = []
    violations: list[str] = []
    runner_died: bool = False
    recycled: bool = False
    files: list[tuple[str, bytes]] = []  # with collect_files: the regular files the job left in /work
    files_truncated: bool = False  # some were left out (links, over the size or count caps)
    in_process_tests: list[int] = []  # trust "mixed": the tests whose events came from an in-process run
    connections: list[dict[str, Any]] = []  # through the egress proxy (runtime/egress.py's records)


class SandboxBackend(Protocol):
    """Runs untrusted jobs. ``execute`` raises SandboxError only when the job could not be run
    for reasons of the backend itself (then it is safe to retry); anything the code does is a
    RunResult."""

    @property
    def limits(self) -> SandboxLimits: ...

    async def execute(self, job: Job) -> RunResult: ...


# The command line carries a bootstrap; the runtime itself arrives on stdin (a -c argument is
# capped at 128 KiB by the kernel): runtime/importer.py's source, which the bootstrap runs, then
# the bundle of the runtime's modules, which its boot() imports from.
BOOTSTRAP = ("import sys;i=sys.stdin.buffer;m=type(sys)('rollstream.consumers.executor.runtime.importer');"
             "exec(compile(i.read(int(i.readline())),'<runner>/importer.py','exec'),m.__dict__);sys.exit(m.boot(i))")


@functools.lru_cache(maxsize=4)
def runner_preamble(entry: str = importer.ENTRY) -> bytes:
    """What the bootstrap reads first from the container's stdin: the importer, then the bundle
    of every module of the runtime package with ``entry`` to run (runtime/importer.py)."""
    package = resources.files(importer.PACKAGE)
    sources = {path.name: path.read_text() for path in package.iterdir() if path.name.endswith(".py")}
    return importer.pack(dict(sorted(sources.items())), entry)


def runtime_identity(container_runtime: str) -> str:
    """The runtime a verdict was decided by: the container runtime (runc, runsc, ...) and the
    digest of what the container runs (runner_preamble: the importer and the bundle)."""
    digest = hashlib.sha256(runner_preamble()).hexdigest()[:16]
    return f"{container_runtime}+runner:{digest}"


def sandbox_identity(backend: Any) -> tuple[str, str]:
    """(image, runtime) a backend decides verdicts under ("unknown" where it does not say: the
    sim backend, a pool not started)."""
    return getattr(backend, "image_id", "") or "unknown", getattr(backend, "runtime", "") or "unknown"


def limits_from_config(config: ExecutorConfig) -> SandboxLimits:
    return SandboxLimits(
        timeout_s=config.default_timeout_s,
        memory_mb=config.memory_mb,
        pids=config.pids,
        cpus=config.cpus,
        output_bytes=config.output_bytes,
        tmpfs_mb=config.tmpfs_mb,
    )


def hardened_config(
    image: str, limits: SandboxLimits, labels: dict[str, str], cmd: list[str], *, interactive: bool = True,
    runtime: str = "runc",
) -> dict[str, Any]:
    """The container create body shared by the warm pool and the one-shot baseline; ``runtime``:
    the OCI runtime dockerd starts it with (``runc``: the host's kernel; ``runsc``: gVisor's)."""
    memory = (limits.memory_mb + RUNNER_OVERHEAD_MB + (RUNSC_OVERHEAD_MB if runtime == "runsc" else 0)) << 20
    env = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/work", "TMPDIR=/work"]
    separated = runtime == "runsc"
    if separated:
        env.append(f"ROLLSTREAM_NPROC={limits.pids}")
    return {
        "Image": image,
        "Cmd": cmd,
        "User": "0:0" if separated else SANDBOX_USER,
        "WorkingDir": "/work",
        "Env": env,
        "Hostname": "sandbox",
        "Labels": labels,
        "NetworkDisabled": True,
        "AttachStdin": interactive,
        "AttachStdout": True,
        "AttachStderr": True,
        "OpenStdin": interactive,
        "StdinOnce": interactive,  # the runner sees EOF (and exits) when its executor goes away
        "Tty": False,
        "HostConfig": {
            "Runtime": runtime,
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "Tmpfs": {
                "/work": f"rw,nosuid,nodev,noexec,size={limits.tmpfs_mb}m,nr_inodes=8192,mode=0700,"
                "uid=65534,gid=65534",
                # multiprocessing's locks and queues need POSIX semaphores, which live here; wiped
                # after every job like /work (the IPC namespace itself stays private and empty)
                SHM: f"rw,nosuid,nodev,noexec,size={SHM_MB}m,nr_inodes=1024,mode=0700,uid=65534,gid=65534",
                # gVisor mounts a writable tmpfs of its own at /tmp unless told otherwise: one that
                # would outlive a job; here it is an empty, read-only one (runc: the read-only root)
                **({"/tmp": "ro,nosuid,nodev,noexec,size=64k,mode=0555"} if separated else {}),
            },
            "CapDrop": ["ALL"],
            "CapAdd": RUNSC_CAPS if separated else [],
            "SecurityOpt": ["no-new-privileges"],
            "Privileged": False,
            "PidsLimit": max(limits.pids, RUNSC_HOST_TASKS) if runtime == "runsc" else limits.pids,
            "Memory": memory,
            "MemorySwap": memory,  # no swap
            "NanoCpus": int(limits.cpus * 1e9),
            "IpcMode": "none",  # private IPC namespace (/dev/shm: the tmpfs above)
            # ...in which no SysV IPC object or POSIX queue can be created, so none can outlive
            # a job and be seen by the next one in the same container.
            "Sysctls": {
                "kernel.shmmni": "0",
                "kernel.msgmni": "0",
                "kernel.sem": "0 0 0 0",
                "fs.mqueue.queues_max": "0",
            },
            "OomScoreAdj": 1000,  # under host memory pressure, sandboxes die first
            "Ulimits": [{"Name": "nofile", "Soft": 256, "Hard": 256}, {"Name": "core", "Soft": 0, "Hard": 0}],
            "LogConfig": {"Type": "none", "Config": {}},
            "AutoRemove": True,
            "Binds": [],
            "Mounts": [],
        },
    }


def process_identity(pid: int | None = None) -> str | None:
    """``pid:starttime`` of a live process (starttime guards against pid reuse), else None."""
    pid = os.getpid() if pid is None else pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return f"{pid}:{fields[19]}"


def _owner_alive(labels: dict[str, str]) -> bool:
    if labels.get(HOST_LABEL) != socket.gethostname():
        return True  # not ours to judge: another host shares this daemon
    identity = labels.get(PROCESS_LABEL, "")
    pid = identity.partition(":")[0]
    return pid.isdigit() and process_identity(int(pid)) == identity


async def remove_orphans(docker: Any, owner: str) -> int:
    """Remove containers of ``owner`` whose executor process is gone. Returns how many."""
    import aiodocker

    found = await docker.containers.list(
        all=True, filters=json.dumps({"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
    )
    removed = 0
    for container in found:
        labels = container._container.get("Labels") or {}
        if labels.get(OWNER_LABEL) != owner or _owner_alive(labels):
            continue
        with contextlib.suppress(aiodocker.DockerError):
            await container.delete(force=True)
            removed += 1
    if removed:
        log.warning("removed %d orphaned sandbox containers of owner %s", removed, owner)
    volumes = (await docker.volumes.list(filters={"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]}))
    for volume in volumes.get("Volumes") or []:  # asset volumes of pools keyed by a set (their fill helpers: above)
        if (volume.get("Labels") or {}).get(OWNER_LABEL) == owner and not _owner_alive(volume.get("Labels") or {}):
            with contextlib.suppress(aiodocker.DockerError):
                await aiodocker.volumes.DockerVolume(docker, volume["Name"]).delete()
                log.warning("removed orphaned asset volume %s of owner %s", volume["Name"], owner)
    return removed


class _Warm:
    """One started container with its attach stream and the reader of the runner's replies."""

    def __init__(self, container: Any, stream: Any, sandbox_id: str) -> None:
        self.container = container
        self.stream = stream
        self.sandbox_id = sandbox_id
        self.container_id = container.id[:12]
        self.executions = 0
        self.ready: dict[str, Any] = {}  # the runner's first message (its Python, what it can check)
        self.egress_source = ""  # a keyed pool's: the name of its own socket at the pool's egress proxy
        self.replies: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.runner_stderr = bytearray()
        self.reader = asyncio.create_task(self._read(), name=f"sandbox-reader-{sandbox_id}")

    async def _read(self) -> None:
        buffer = bytearray()
        try:
            while (message := await self.stream.read_out()) is not None:
                if message.stream != 1:
                    self.runner_stderr = (self.runner_stderr + message.data)[-TAIL_BYTES:]
                    continue
                buffer += message.data
                while (end := buffer.find(b"\n")) >= 0:
                    line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                    try:
                        self.replies.put_nowait(json.loads(line))
                    except ValueError:
                        log.warning("sandbox %s: unreadable runner line %r", self.sandbox_id, line[:200])
        except Exception as exc:  # a broken stream reads like a dead runner
            log.warning("sandbox %s: attach stream failed: %s", self.sandbox_id, exc)
        finally:
            self.replies.put_nowait(None)

    async def send(self, request: dict[str, Any]) -> None:
        await self.stream.write_in(json.dumps(request).encode() + b"\n")

    async def receive(self, timeout_s: float) -> dict[str, Any] | None:
        """The next reply; None when the runner died; TimeoutError when it does not answer."""
        async with asyncio.timeout(timeout_s):  # no extra task per call, unlike wait_for
            return await self.replies.get()


def _workspace(reply: dict[str, Any]) -> tuple[list[tuple[str, bytes]], bool]:
    """The files a job left (``collect_files``), as the runner listed them; what does not read as
    (path, base64) within the caps is left out."""
    files: list[tuple[str, bytes]] = []
    total, truncated = 0, bool(reply.get("workspace_truncated"))
    listed = reply.get("files")
    for item in listed if isinstance(listed, list) else []:
        try:
            path, encoded = item
            data = base64.b64decode(encoded, validate=True)
        except (TypeError, ValueError):
            truncated = True
            continue
        total += len(data)
        if not isinstance(path, str) or len(path) > 1024 or total > WORKSPACE_BYTES:
            truncated = True
            continue
        files.append((path, data))
    return files, truncated


class _Keyed:
    """A pool keyed by a set of assets and a network allowlist, with its volumes and its proxy."""

    def __init__(self, key: str, pool: DockerSandboxPool, volumes: list[str], proxy: EgressProxy | None) -> None:
        self.key, self.pool, self.volumes, self.proxy = key, pool, volumes, proxy
        self.in_flight = 0
        self.last_used = time.monotonic()


class DockerSandboxPool:
    """The aiodocker :class:`SandboxBackend`: ``async with DockerSandboxPool(config) as pool``."""

    def __init__(self, config: ExecutorConfig, *, owner: str | None = None, grace_s: float = 3.0,
                 test_hooks: bool = False, volume: str = "", egress: tuple[EgressProxy, str] | None = None) -> None:
        self.config = config
        self.volume = volume  # a keyed pool's: the asset volume its containers mount at /assets
        self.egress = egress  # a keyed pool's: its egress proxy and the volume of the proxy's socket
        self.keyed = bool(volume or egress)
        self.test_hooks = test_hooks  # tests only: the runner honours Job.test_hook
        self.owner = owner or config.owner
        self.grace_s = grace_s
        self._limits = limits_from_config(config)
        self._docker: Any = None
        self._idle: asyncio.Queue[_Warm] = asyncio.Queue()
        self._all: set[_Warm] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._broken: BaseException | None = None
        self._leftover: list[Any] = []  # containers the engine could not be asked to delete yet
        self._names = itertools.count()
        self._run_id = secrets.token_hex(3)
        self.recycled = 0
        self.image_id = ""  # the sandbox image's id (sha256:...), known once started
        self.has_pytest = False  # the image has pytest (image.py PYTEST_LABEL), known once started
        self.runtime = ""  # runtime_identity(): what runs the containers and the runner
        self._keyed: dict[str, _Keyed] = {}  # set_key(assets) -> the pool of that set
        self._keyed_starting: dict[str, asyncio.Lock] = {}
        self.assets: AssetCache | None = None  # made when a job first has assets

    @property
    def limits(self) -> SandboxLimits:
        return self._limits

    async def __aenter__(self) -> DockerSandboxPool:
        import aiodocker

        self._docker = aiodocker.Docker(url=self.config.docker_url or None)
        try:
            image = await self._docker.images.inspect(self.config.image)
            info = await self._docker.system.info()
        except Exception as exc:
            await self._docker.close()
            if isinstance(exc, aiodocker.DockerError) and exc.status == 404:
                raise SandboxError(
                    f"sandbox image {self.config.image!r} not found; "
                    "build it with `rollstream sandbox build --offline`"
                ) from exc
            raise SandboxError(f"cannot use the Docker daemon: {exc}") from exc
        self.image_id = str(image.get("Id") or self.config.image)
        self.has_pytest = PYTEST_LABEL in ((image.get("Config") or {}).get("Labels") or {})
        registered = sorted(info.get("Runtimes") or {"runc": {}})
        if self.config.runtime not in registered:
            await self._docker.close()
            raise SandboxError(
                f"executor.runtime = {self.config.runtime!r} is not registered with the Docker engine (it has: "
                f"{', '.join(registered)}); `.ci/install` registers runsc, `rollstream sandbox doctor` says which "
                "runtimes work here (docs/executor.md, \"Runtimes\")")
        self.runtime = runtime_identity(self.config.runtime)
        try:
            await remove_orphans(self._docker, self.owner)
            warm = await asyncio.gather(*(self._spawn() for _ in range(self.config.pool_size)))
        except BaseException:
            await self.aclose()
            raise
        for w in warm:
            self._idle.put_nowait(w)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        keyed, self._keyed = list(self._keyed.values()), {}
        await asyncio.gather(*(self._retire_keyed(k) for k in keyed), return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(self._remove(w) for w in list(self._all)), return_exceptions=True)
        if self._docker is not None:
            with contextlib.suppress(Exception):
                await self._remove_leftovers()
            await self._docker.close()
            self._docker = None

    def labels(self) -> dict[str, str]:
        return {
            LABEL: "1",
            OWNER_LABEL: self.owner,
            HOST_LABEL: socket.gethostname(),
            PROCESS_LABEL: process_identity() or "",
        }

    async def _spawn(self) -> _Warm:
        """Create, attach, start a container and wait for its runner to say it is ready."""
        name = f"rollstream-sbx-{self._run_id}-{next(self._names)}-{secrets.token_hex(2)}"
        cmd = ["python3", "-I", "-S", "-c", BOOTSTRAP] + (["--test-hooks"] if self.test_hooks else [])
        body = hardened_config(self.config.image, self._limits, self.labels(), cmd, runtime=self.config.runtime)
        if self.volume:
            body["HostConfig"]["Mounts"].append({"Type": "volume", "Source": self.volume, "Target": ASSETS,
                                                 "ReadOnly": True, "VolumeOptions": {"NoCopy": True}})
        source = ""
        if self.egress is not None:  # still network none: its own socket at the proxy is the only way out
            # A socket per container, under a random name only this container's PID 1 learns (the
            # directory cannot be listed): what reaches the proxy through it is this container's,
            # under limits of its own, so one container's code cannot starve another's job.
            source = secrets.token_hex(16)
            path = await self.egress[0].listen(source)
            body["HostConfig"]["Mounts"].append({"Type": "volume", "Source": self.egress[1], "Target": "/egress",
                                                 "ReadOnly": True, "VolumeOptions": {"NoCopy": True}})
            body["Env"].append(f"ROLLSTREAM_EGRESS={path}")
        try:
            container = await self._docker.containers.create(body, name=name)
        except BaseException:
            if source:
                await self.egress[0].unlisten(source)  # type: ignore[index]
            raise
        stream = container.attach(stdin=True, stdout=True, stderr=True)
        try:
            await stream.__aenter__()  # attach before start: output is not logged anywhere else
            await container.start()
        except BaseException:
            await stream.close()
            with contextlib.suppress(Exception):
                await container.delete(force=True)
            if source:
                await self.egress[0].unlisten(source)  # type: ignore[index]
            raise
        warm = _Warm(container, stream, name)
        warm.egress_source = source
        self._all.add(warm)
        try:
            await warm.stream.write_in(runner_preamble())
            ready = await warm.receive(READY_TIMEOUT_S)
        except TimeoutError:
            ready = None
        if not ready or not ready.get("ready"):
            detail = bytes(warm.runner_stderr).decode(errors="replace")
            await self._remove(warm)
            raise SandboxError(f"sandbox {name} did not start: {ready!r} {detail}")
        if ready.get("channels_guarded") is not True:
            await self._remove(warm)
            raise SandboxError(
                f"the {self.config.runtime} runtime here lets the code under test open the runner's descriptors "
                "(/proc/1/fd of a non-dumpable process): a completion could read its tests from the judge's part and "
                "write on the runner's channels, so no verdict from it could be trusted (Debian 12's gVisor, runsc "
                "2022-12-19, does); use executor.runtime = \"runc\" (docs/executor.md, \"Runtimes\")")
        warm.ready = ready
        return warm

    async def _remove(self, warm: _Warm) -> None:

        self._all.discard(warm)
        warm.reader.cancel()
        with contextlib.suppress(Exception):
            await warm.stream.close()
        await self._delete(warm.container)
        if warm.egress_source and self.egress is not None:
            await self.egress[0].unlisten(warm.egress_source)

    async def _delete(self, container: Any) -> None:
        """Delete ``container``; one the engine could not be asked to delete (unreachable) is kept
        in ``_leftover`` and tried again later (the next executor start removes any left as orphans)."""
        import aiodocker

        try:
            await container.delete(force=True)
        except aiodocker.DockerError as exc:
            if exc.status != 404:  # 404: auto-removed already
                self._leftover.append(container)
        except Exception:  # the engine unreachable
            self._leftover.append(container)

    async def _remove_leftovers(self) -> None:
        leftover, self._leftover = self._leftover, []
        for container in leftover:
            await self._delete(container)

    def _retire(self, warm: _Warm) -> None:
        """Remove ``warm`` and start a replacement in the background."""
        self.recycled += 1
        task = asyncio.create_task(self._replace(warm), name=f"sandbox-replace-{warm.sandbox_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, warm: _Warm) -> None:
        await self._remove(warm)
        await self._remove_leftovers()
        try:  # whatever Docker or its HTTP client raise: a hiccup until it happened five times
            fresh = await retry(self._spawn, what=f"replacing sandbox {warm.sandbox_id}",
                                retry_on=(Exception,), attempts=5, first_delay_s=0.5, max_delay_s=4.0)
        except Exception as exc:  # a background task has no caller: execute() reports it
            log.error("could not replace sandbox %s: %s", warm.sandbox_id, exc)
            self._broken = exc
            return
        self._idle.put_nowait(fresh)

    async def _acquire(self) -> _Warm:
        while True:
            if self._broken is not None and not self._all:
                raise SandboxError(f"no sandbox can be started: {self._broken}") from self._broken
            if not self._idle.empty():
                return self._idle.get_nowait()
            try:
                async with asyncio.timeout(1.0):  # wake up now and then to notice a broken pool
                    return await self._idle.get()
            except TimeoutError:
                continue

    async def execute(self, job: Job) -> RunResult:
        if (job.assets or job.network) and not self.keyed:
            return await self._execute_keyed(job)
        return await self._execute(job)

    async def _execute(self, job: Job) -> RunResult:
        if job.pytest and not self.has_pytest:
            raise SandboxError(f"the sandbox image {self.config.image!r} has no pytest (built before pytest files): "
                               "rebuild it with `rollstream sandbox build --offline` (or without --offline)")
        warm = await self._acquire()
        request = {
            "id": job.job_id,
            "nonce": secrets.token_hex(8),  # the reply must carry it: nothing else is this job's verdict
            "setup": job.setup,
            "code": job.code,
            "tests": job.tests,
            "names": job.names,
            "modules": job.modules,
            "entry_point": job.entry_point,
            "program": job.program,
            "pytest": job.pytest,
            "trust": job.trust,
            "rules": job.rules,
            "timeout_s": job.timeout_s,
            "memory_mb": min(job.memory_mb, self._limits.memory_mb),
            "output_bytes": self._limits.output_bytes,
            "tail_bytes": TAIL_BYTES,
            "file_bytes": self._limits.tmpfs_mb << 20,
        }
        if job.test_hook is not None and self.test_hooks:
            request["test_hook"] = job.test_hook
        if job.runner_hook is not None and self.test_hooks:
            request["runner_hook"] = job.runner_hook
        if job.files or job.collect_files:
            request.update(files=[[path, base64.b64encode(data).decode()] for path, data in job.files],
                           collect_files=job.collect_files, workspace_bytes=WORKSPACE_BYTES)
        if warm.reader.done() or not warm.replies.empty():  # died while idle: not this job's doing
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id} died while idle", "died_idle")
        if self.egress is None:
            return await self._run(warm, job, request)
        return await self._run_with_egress(warm, job, request, self.egress[0])

    async def _run_with_egress(self, warm: _Warm, job: Job, request: dict[str, Any], proxy: EgressProxy) -> RunResult:
        """The job with its own token at the proxy, valid on its container's socket alone: its
        connections, and what the proxy refused of its container while it ran, are its own."""
        token = secrets.token_hex(16)
        try:
            await proxy.begin(token, job.job_id, job.network, self.config.egress_private, warm.egress_source)
        except Exception as exc:  # the proxy's stream is gone: not this job's doing, nothing of it ran
            self._idle.put_nowait(warm)
            raise SandboxLost(f"egress proxy {proxy.warm.sandbox_id} is gone: {exc}", "egress_lost") from exc
        request["egress_token"] = token
        try:
            result = await self._run(warm, job, request)
        except asyncio.CancelledError:  # a stop: the proxy closes the job's connections, nobody waits for it
            ending = asyncio.create_task(proxy.end(token), name=f"egress-end-{job.job_id}")
            self._tasks.add(ending)
            ending.add_done_callback(self._tasks.discard)
            raise
        except BaseException:
            await proxy.end(token)
            raise
        return msgspec.structs.replace(result, connections=await proxy.end(token))

    async def _run(self, warm: _Warm, job: Job, request: dict[str, Any]) -> RunResult:
        try:
            await warm.send(request)
        except Exception as exc:
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id}: could not send the job: {exc}", "send_failed") from exc
        started = time.monotonic()
        try:
            reply = await warm.receive(job.timeout_s + self.grace_s)
        except TimeoutError:
            reply = {"id": job.job_id, "nonce": request["nonce"], "timed_out": True,
                     "violations": ["runner_unresponsive"], "clean": False}
        except asyncio.CancelledError:  # its reply would be taken for the next job's: replace it
            self._retire(warm)
            raise
        if reply is None:  # the attach stream ended: PID 1 is gone, or so is the engine or the container
            cause = await self._why_lost(warm)
            if cause is not None:
                self._retire(warm)
                raise SandboxLost(f"sandbox {warm.sandbox_id}: {cause.replace('_', ' ')} during job {job.job_id}",
                                  cause)
        elif reply.get("ran") is False:
            # The runner refused the job: its container is unfit (runtime/supervisor.py says why in
            # "unfit", a structured field). Not this job's doing, and nothing of it ran.
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id} was unfit for a job: {str(reply.get('unfit'))[:200]}",
                              "container_unfit")
        elif "error" in reply or reply.get("id") != job.job_id or reply.get("nonce") != request["nonce"]:
            # PID 1 failed handling it (a runner bug, a request it could not read) or answered for
            # another job: not attributable to this job, never its verdict; the container goes
            self._retire(warm)
            raise SandboxLost(f"sandbox {warm.sandbox_id}: runner error: "
                              f"{str(reply.get('error', 'a reply for another job'))[:200]}", "runner_error")
        warm.executions += 1
        result = await self._result(warm, job, reply, time.monotonic() - started)
        if result.recycled:
            self._retire(warm)
        else:
            self._idle.put_nowait(warm)
        return result

    async def _execute_keyed(self, job: Job) -> RunResult:
        keyed = await self._keyed_for(job.assets, job.network)
        if keyed.proxy is not None and not keyed.proxy.alive:  # its proxy died: the pool goes, a new one comes
            async with self._keyed_starting[keyed.key]:
                if self._keyed.get(keyed.key) is keyed and keyed.in_flight == 0:
                    log.warning("the egress proxy of pool %s is gone: retiring the pool", keyed.key)
                    del self._keyed[keyed.key]
                    await self._retire_keyed(keyed)
            keyed = await self._keyed_for(job.assets, job.network)
        keyed.in_flight += 1
        try:
            return await keyed.pool.execute(job)
        finally:
            keyed.in_flight -= 1
            keyed.last_used = time.monotonic()

    async def _keyed_for(self, assets: list[Asset], network: list[str]) -> _Keyed:
        """The pool of this set of assets and network allowlist, started when first asked for: its
        assets fetched, verified and copied into a volume of its own, its egress proxy started.
        AssetError or EgressError (ValueErrors: the action's) when what it asks for cannot be had."""
        check_allowed(network, self.config.egress_allowed)
        assets_key = set_key(assets) if assets else ""
        key = f"{assets_key}/{network_key(network)}"
        async with self._keyed_starting.setdefault(key, asyncio.Lock()):
            keyed = self._keyed.get(key)
            if keyed is not None:
                return keyed
            volumes: list[str] = []
            proxy: EgressProxy | None = None
            try:
                volume = ""
                if assets:
                    if self.assets is None:
                        self.assets = AssetCache.from_config(self.config)
                    resolved = await self.assets.resolve_all(assets)
                    volume = f"rollstream-assets-{assets_key[:16]}-{secrets.token_hex(3)}"
                    volumes.append(volume)
                    await self._fill_volume(volume, archive(resolved))
                egress = None
                if network:
                    proxy, socket_volume = await self._start_proxy(network_key(network), volumes)
                    egress = (proxy, socket_volume)
                pool = DockerSandboxPool(msgspec.structs.replace(self.config, pool_size=self.config.keyed_pool_size),
                                         owner=self.owner, grace_s=self.grace_s, test_hooks=self.test_hooks,
                                         volume=volume, egress=egress)
                await pool.__aenter__()
            except BaseException:
                if proxy is not None:
                    await self._stop_proxy(proxy)
                for name in volumes:
                    await self._delete_volume(name)
                raise
            keyed = self._keyed[key] = _Keyed(key, pool, volumes, proxy)
            log.info("started the pool of %s%s", f"asset set {assets_key} ({', '.join(a.path for a in assets)})"
                     if assets else "", f" network {', '.join(network)}" if network else "")
            if not any(t.get_name() == "asset-pools-reaper" and not t.done() for t in self._tasks):
                task = asyncio.create_task(self._reap_keyed(), name="asset-pools-reaper")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return keyed

    async def _fill_volume(self, volume: str, tar: bytes) -> None:
        """A volume of its own holding ``tar``: written through the engine's archive API into a
        container that never starts (no bind mount of the executor's files: works from compose)."""
        await self._docker.volumes.create({"Name": volume, "Labels": self.labels()})
        try:
            helper = await self._docker.containers.create(
                {"Image": self.config.image, "Cmd": ["true"], "NetworkDisabled": True, "Labels": self.labels(),
                 "HostConfig": {"NetworkMode": "none", "Mounts": [{"Type": "volume", "Source": volume,
                                                                    "Target": "/fill"}]}},
                name=f"{volume}-fill")
            try:
                await helper.put_archive("/fill", tar)
            finally:
                await self._delete(helper)
        except BaseException:
            await self._delete_volume(volume)
            raise

    async def _start_proxy(self, key: str, volumes: list[str]) -> tuple[EgressProxy, str]:
        """An egress proxy container (runtime/egress.py) and the volume its socket lives in."""
        volume = f"rollstream-egress-{key[:16]}-{secrets.token_hex(3)}"
        volumes.append(volume)
        await self._fill_volume(volume, socket_dir_archive())
        name = f"{volume}-proxy"
        cmd = ["python3", "-I", "-S", "-c", BOOTSTRAP, SOCKET]
        container = await self._docker.containers.create(
            proxy_config(self.config.image, self.labels(), volume, self.config.egress_network, cmd), name=name)
        stream = container.attach(stdin=True, stdout=True, stderr=True)
        try:
            await stream.__aenter__()
            await container.start()
        except BaseException:
            await stream.close()
            await self._delete(container)
            raise
        warm = _Warm(container, stream, name)
        try:
            await stream.write_in(runner_preamble(importer.EGRESS_ENTRY))
            ready = await warm.receive(PROXY_READY_TIMEOUT_S)
        except TimeoutError:
            ready = None
        proxy = EgressProxy(warm)
        if not ready or ready.get("op") != "ready":
            await self._stop_proxy(proxy)
            raise SandboxError(f"egress proxy {name} did not start on network {self.config.egress_network!r}: "
                               f"{ready!r} {bytes(warm.runner_stderr).decode(errors='replace')}")
        return proxy, volume

    async def _stop_proxy(self, proxy: EgressProxy) -> None:
        await proxy.aclose()
        warm = proxy.warm
        warm.reader.cancel()
        with contextlib.suppress(Exception):
            await warm.stream.close()
        await self._delete(warm.container)

    async def _delete_volume(self, volume: str) -> None:
        import aiodocker

        try:
            await aiodocker.volumes.DockerVolume(self._docker, volume).delete()
        except Exception as exc:  # in use by a container still being removed, or the engine gone
            log.warning("could not delete asset volume %s: %s (the next start removes it)", volume, exc)

    async def _retire_keyed(self, keyed: _Keyed) -> None:
        await keyed.pool.aclose()
        if keyed.proxy is not None:
            await self._stop_proxy(keyed.proxy)
        for volume in keyed.volumes:
            await self._delete_volume(volume)

    async def _reap_keyed(self) -> None:
        """Retire the keyed pools idle for ``keyed_pool_idle_s``."""
        idle_s = self.config.keyed_pool_idle_s
        while self._keyed:
            await asyncio.sleep(min(10.0, idle_s / 4))
            now = time.monotonic()
            for key, keyed in list(self._keyed.items()):
                if keyed.in_flight == 0 and now - keyed.last_used >= idle_s:
                    async with self._keyed_starting.setdefault(key, asyncio.Lock()):
                        if keyed.in_flight == 0 and self._keyed.get(key) is keyed:
                            log.info("retiring the idle pool of asset set %s", key)
                            await self._retire_keyed(keyed)
                            del self._keyed[key]

    async def _why_lost(self, warm: _Warm) -> str | None:
        """Why a runner stopped answering mid-job: a cause when the machinery failed (SandboxLost),
        None when the container's memory limit killed it (the job's doing: an ``oom`` verdict).
        PID 1 cannot be signalled from inside (under runc it is the namespace's init; under runsc
        another uid than the job's), so a container still there, not OOM-killed, whose runner is
        gone was stopped from outside or failed by itself."""
        import aiodocker

        try:
            info = await warm.container.show()
        except aiodocker.DockerError as exc:
            return "container_gone" if exc.status == 404 else "engine_unreachable"
        except Exception:  # the engine's socket refused or cut (aiohttp's errors, OSError)
            return "engine_unreachable"
        state = info.get("State") or {}
        if state.get("OOMKilled"):
            return None
        if state.get("Running"):
            return "stream_lost"  # the engine dropped the attach stream; the runner may live on
        return "container_killed" if state.get("ExitCode") in (137, 143) else "runner_died"

    async def _result(
        self, warm: _Warm, job: Job, reply: dict[str, Any] | None, waited_s: float
    ) -> RunResult:
        died = reply is None
        if died:  # the container's memory limit killed PID 1 (the only death _why_lost leaves to here)
            reply = {"violations": ["runner_died", "oom_killed"], "clean": False, "oom_killed": True}
        violations = [str(v)[:200] for v in reply.get("violations", [])]
        files, truncated = _workspace(reply)
        if reply.get("oom_killed") and "oom_killed" not in violations:
            violations.append("oom_killed")  # the cgroup OOM killer ran: the runner may be hurt
        events = [e for e in reply.get("events", []) if isinstance(e, dict)]
        # Retired after any violation: an attack on the sandbox (violations, a runner not clean) or
        # on the verdict (the judge's tamper events: messages the honest code never sends), whether
        # or not the runner saw harm: a container whose last job attacked it serves no other job.
        attacked = bool(violations) or any(e.get("e") == "tamper" for e in events)
        recycled = attacked or not reply.get("clean", False) or warm.executions >= self.config.recycle_after
        return RunResult(
            sandbox_id=warm.sandbox_id,
            container_id=warm.container_id,
            exit_code=reply.get("exit_code"),
            signal=reply.get("signal"),
            duration_s=float(reply.get("duration_s", waited_s)),
            timed_out=bool(reply.get("timed_out", False)),
            output_limit=bool(reply.get("output_limit", False)),
            oom_killed=bool(reply.get("oom_killed", False)),
            output_bytes=int(reply.get("output_bytes", 0)),
            stdout_tail=str(reply.get("stdout_tail", ""))[-TAIL_BYTES:],
            stderr_tail=str(reply.get("stderr_tail", ""))[-TAIL_BYTES:],
            events=events,
            violations=violations,
            runner_died=died,
            recycled=recycled,
            files=files,
            files_truncated=truncated,
        )
