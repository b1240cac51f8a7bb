"""What a sandbox container is made of: its create body, its command line and what its stdin starts with.

* Every container is created with :func:`hardened_config`: no network, read-only root, a
  size-capped tmpfs ``/work`` (noexec) and a small one at ``/dev/shm`` (multiprocessing's
  semaphores), all capabilities dropped, no-new-privileges, uid 65534, pids/memory/CPU limits,
  no IPC namespace sharing, no mounts of the host,
  no Docker socket, logging off (output only travels over the attach stream, capped).
* It runs ``python3 -I -S -c BOOTSTRAP`` (:func:`runner_command`); the in-container runtime
  (consumers/executor/runtime/) arrives on its stdin (:func:`runner_preamble`), and
  :func:`runtime_identity` names the container runtime and the digest of what it runs, which every
  verdict records.

The warm pool (consumers/executor/pool.py), the egress proxy (consumers/executor/keyed.py) and the
one-shot baseline of bench/executor.py create their containers from here.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from typing import Any

from rollstream.consumers.executor.runtime import importer
from rollstream.schemas.events import SandboxLimits

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
ASSETS = "/assets"  # where a keyed pool's set of assets is mounted, read-only
SHM = "/dev/shm"
SHM_MB = 16  # multiprocessing's semaphores and queues (a tmpfs of its own, wiped after every job)


def hardened_config(
    image: str, limits: SandboxLimits, labels: dict[str, str], cmd: list[str], *, interactive: bool = True,
    runtime: str = "runc", exec_work: bool = False,
) -> dict[str, Any]:
    """The container create body shared by the warm pool and the one-shot baseline; ``runtime``:
    the OCI runtime dockerd starts it with (``runc``: the host's kernel; ``runsc``: gVisor's).
    ``exec_work``: ``/work`` mounted ``exec`` (a language pool's: the programs it builds run from
    there; they are native code either way; Python's pools keep ``noexec``, Docker's default for a tmpfs)."""
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
                "/work": f"rw,nosuid,nodev,{'exec,' if exec_work else 'noexec,'}size={limits.tmpfs_mb}m,nr_inodes=8192,mode=0700,"
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


def runner_command(*args: str) -> list[str]:
    """The command line of a container that runs the runtime (the runner, the egress proxy)."""
    return ["python3", "-I", "-S", "-c", BOOTSTRAP, *args]
