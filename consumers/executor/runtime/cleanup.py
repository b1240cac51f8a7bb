"""After each job, in the sandbox (part of the runtime's one source, see
consumers/executor/runtime/supervisor.py; standard library only): nothing but PID 1 and the
zygotes may be left, and nothing the job wrote."""

import os
import signal
import time

if __name__ != "__main__":  # on the host (linters, readers): what the sandbox gets from the files above
    from rollstream.consumers.executor.runtime.workspace import WORK, _wipe

MQUEUE = "/dev/mqueue"
SHM = "/dev/shm"  # a tmpfs of its own, for multiprocessing's semaphores: wiped like /work


def _pids():
    return [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def cleanup(host, collect=None):
    """Make sure no process is left but init and the zygotes, call ``collect()`` (nothing of the
    job runs any more), then wipe the writable places. Returns (processes that outlived the job,
    problems). Three tasks in the container's pids cgroup are PID 1 and the zygotes: nothing to
    reap or kill, the usual case. Otherwise everything but PID 1 is killed, zygotes included
    (the container is then replaced)."""
    problems = []
    survivors = 0
    expected = 1 + len(host.zygotes) + len(host.ahead)  # a child forked ahead waits for the next job
    if not host.zygotes or host.tasks() != expected:
        _reap()  # zombies of the job's orphans, reparented to init, keep the count up
        live = set(_live_pids(()))
        for role, pid in list(host.ahead.items()):
            if pid not in live:  # a child forked ahead that died before its job: its zygote forks anew
                del host.ahead[role]
        survivors = len(live - {str(pid) for pid in host.zygotes} - set(host.ahead.values()))
        count = host.tasks()
        if survivors or (count is not None and count > 1 + len(host.zygotes) + len(host.ahead)):
            host.drop_zygotes()
            problems += _kill_all()
    if collect is not None:
        collect()
    if os.listdir(WORK):
        _wipe(WORK)
        if os.listdir(WORK):
            problems.append("cleanup_failed:work_dir")
    try:
        if os.listdir(SHM):
            _wipe(SHM)
            if os.listdir(SHM):
                problems.append("cleanup_failed:shm")
    except OSError:
        pass
    try:
        if os.listdir(MQUEUE):  # creating queues is disabled by sysctl; checked anyway
            _wipe(MQUEUE)
            problems.append("cleanup_failed:mqueue")
    except OSError:
        pass
    return survivors, problems


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _live_pids(spare):
    """Processes other than init and ``spare`` that are not zombies."""
    live = []
    for p in _pids():
        if p in spare:
            continue
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != b"Z":
            live.append(p)
    return live


def _kill_all():
    """Kill every process but init (``kill(-1)`` is atomic with respect to fork, so a fork bomb
    cannot outrun it) and reap them all."""
    for _ in range(600):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap()
        if not _pids():
            return []
        time.sleep(0.0005)
    return ["cleanup_failed:processes"]


def sysv_ipc_objects():
    """SysV IPC objects in this IPC namespace (creating them is disabled by sysctl)."""
    found = 0
    for kind in ("shm", "msg", "sem"):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                found += len(f.read().splitlines()) - 1
        except OSError:
            continue
    return found
