"""After each job, in the sandbox (a module of the runtime, in its bundle,
runtime/importer.py; standard library only): nothing but PID 1 and the
zygotes may be left, and nothing the job wrote."""

import os
import signal
import time

from rollstream.consumers.executor.runtime.workspace import WORK, wipe

MQUEUE = "/dev/mqueue"
SHM = "/dev/shm"  # a tmpfs of its own, for multiprocessing's semaphores: wiped like /work
DEAD = (b"Z", b"X")  # process states in /proc/<pid>/stat: a zombie, a task being released
SETTLE_S = 1.0  # how long the job's ended processes may take to be reaped before the container is given up


def _pids():
    return [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def cleanup(host, collect=None, settle_s=SETTLE_S):
    """Make sure no process is left but init and the zygotes, call ``collect()`` (nothing of the
    job runs any more), then wipe the writable places. Returns (processes that outlived the job,
    problems). Tasks in the container's pids cgroup that are PID 1, the zygotes and the children forked ahead: nothing to
    reap or kill, the usual case. Otherwise what is left is reaped until it is gone (``_settle``,
    at most ``settle_s``); if a process still lives, or zombies stay, everything but PID 1 is
    killed, zygotes included (the container is then replaced)."""
    problems = []
    survivors = 0
    if not host.zygotes or host.tasks() != _expected(host):
        survivors, settled = _settle(host, settle_s)
        count = host.tasks()
        if survivors or not settled or (count is not None and count > _expected(host)):
            host.drop_zygotes()
            problems += kill_all()
    if collect is not None:
        collect()
    if os.listdir(WORK):
        wipe(WORK)
        if os.listdir(WORK):
            problems.append("cleanup_failed:work_dir")
    try:
        if os.listdir(SHM):
            wipe(SHM)
            if os.listdir(SHM):
                problems.append("cleanup_failed:shm")
    except OSError:
        pass
    try:
        if os.listdir(MQUEUE):  # creating queues is disabled by sysctl; checked anyway
            wipe(MQUEUE)
            problems.append("cleanup_failed:mqueue")
    except OSError:
        pass
    return survivors, problems


def _expected(host):
    """The tasks a clean container holds: PID 1 (and its relay thread), the zygotes, the children
    forked ahead waiting for the next job."""
    return 1 + host.threads + len(host.zygotes) + len(host.ahead)


def _settle(host, settle_s):
    """Reap until no process is left but init, the zygotes and the children forked ahead, or one
    that still lives is found, or ``settle_s`` has passed. Returns (how many processes outside
    that set still live, whether nothing outside it is left).

    A zombie is no survivor but not gone either: it is reaped, and waited for until it is. Under
    gVisor a killed process's children are handed to init only once it has finished exiting, which
    can be after one round of reaping; a single reap followed by a scan that passes over zombies
    left them in the container as PID 1's unreaped children, seen by the next job (a fork bomb's
    dozens of them, about one run in eight). A process still exiting is listed as running: it is
    a survivor, as is one a process group's kill missed (gVisor's ``clone`` does not check for a
    pending SIGKILL as Linux's does), and the caller kills everything."""
    deadline = time.monotonic() + settle_s
    while True:
        _reap()
        states = _states()
        for role, pid in list(host.ahead.items()):
            if states.get(pid, b"Z") in DEAD:  # a child forked ahead that died before its job: its zygote forks anew
                del host.ahead[role]
        spare = {str(pid) for pid in host.zygotes} | set(host.ahead.values())
        left = [state for pid, state in states.items() if pid not in spare]
        live = sum(1 for state in left if state not in DEAD)
        if live or not left:
            return live, not left
        if time.monotonic() >= deadline:
            return 0, False
        time.sleep(0.0005)


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _states():
    """Every process but init: its pid (text) -> its state letter (``R``, ``S``, ``Z``, ...)."""
    states = {}
    for p in _pids():
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                states[p] = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
    return states


def kill_all():
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


# The runner's own seccomp filter (the same under every runtime: gVisor applies no Docker profile
# inside its kernel, and ignores the container's IPC sysctls). By architecture (AUDIT_ARCH_*):
# system calls creating an IPC object that would outlive its process (SysV shared memory, message
# queues, semaphore sets; POSIX message queues), denied with ENOSPC as those sysctls make them
# under runc; namespace calls (unshare, setns, a clone asking for a new namespace), denied with
# EPERM as Docker's profile does; clone3 (its flags out of a filter's sight) with ENOSYS, so that
# the C library falls back to clone.
SECCOMP_ARCHES = {
    0xC000003E: ("x86_64", {"ipc": (29, 64, 68, 240), "namespaces": (272, 308), "clone": 56, "clone3": 435}),
    0xC00000B7: ("aarch64", {"ipc": (194, 190, 186, 180), "namespaces": (97, 268), "clone": 220, "clone3": 435}),
}
CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, SECCOMP_RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSPC, ENOSYS = 1, 28, 38


def seccomp_program(arch, calls):
    """The filter as (code, jt, jf, k) instructions: see SECCOMP_ARCHES. A call through another
    ABI (i386's entry points; x86_64's x32 numbers, bit 30) kills its process: those reach the
    same objects under other numbers."""
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    code = [("ld", 4), ("jeq", arch, None, "kill"), ("ld", 0), ("jge", 0x40000000, "kill", None)]
    code += [("jeq", n, "enospc", None) for n in calls["ipc"]]
    code += [("jeq", n, "eperm", None) for n in calls["namespaces"]]
    code += [("jeq", calls["clone3"], "enosys", None), ("jeq", calls["clone"], "clone", None), ("ret", "allow"),
             ("label", "clone"), ("ld", 16),  # seccomp_data.args[0], its low word: clone's flags
             ("jset", CLONE_NAMESPACES, "eperm", None), ("ret", "allow")]
    returns = {"kill": SECCOMP_RET_KILL_PROCESS, "allow": SECCOMP_RET_ALLOW, "eperm": SECCOMP_RET_ERRNO | EPERM,
               "enospc": SECCOMP_RET_ERRNO | ENOSPC, "enosys": SECCOMP_RET_ERRNO | ENOSYS}
    for name in ("kill", "eperm", "enospc", "enosys"):
        code += [("label", name), ("ret", name)]
    labels, at = {}, 0
    for op in code:
        if op[0] == "label":
            labels[op[1]] = at
        else:
            at += 1
    program, at = [], 0
    for op in code:
        if op[0] == "label":
            continue
        if op[0] == "ld":
            program.append((ld_abs, 0, 0, op[1]))
        elif op[0] == "ret":
            program.append((ret, 0, 0, returns[op[1]]))
        else:
            jt = 0 if op[2] is None else labels[op[2]] - at - 1
            jf = 0 if op[3] is None else labels[op[3]] - at - 1
            program.append(({"jeq": jeq, "jge": jge, "jset": jset}[op[0]], jt, jf, op[1]))
        at += 1
    return program


def install_seccomp(host):
    """Install the runner's filter (``seccomp_program``), inherited by every process forked from
    here on. Raises OSError when the kernel refuses it: a runner that cannot keep jobs apart does
    not start."""
    import ctypes

    machine = os.uname().machine
    arch = next((a for a, (name, _) in SECCOMP_ARCHES.items() if name == machine), None)
    if arch is None:
        raise OSError(f"no seccomp filter for {machine}")
    program = seccomp_program(arch, SECCOMP_ARCHES[arch][1])

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*(Filter(*f) for f in program))
    fprog = Program(len(program), filters)
    if host.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused (is no_new_privs set?)")


def sysv_ipc_objects(libc):
    """SysV IPC objects in this IPC namespace (creating them is refused: sysctls and the runner's
    filter), as the kernel's own counts say (``SHM_INFO``, ``MSG_INFO``, ``SEM_INFO``: gVisor has
    no /proc/sysvipc); -1 when it will not say."""
    import ctypes

    info = ctypes.create_string_buffer(256)
    ints = ctypes.cast(info, ctypes.POINTER(ctypes.c_int))
    found = 0
    # (the call, its *_INFO command, where the count of existing objects sits in what it fills)
    for call, command, index in ((libc.shmctl, 14, 0), (libc.msgctl, 12, 0), (libc.semctl, 19, 7)):
        args = (0, 0, command, info) if call is libc.semctl else (0, command, info)
        if call(*args) < 0:
            return -1
        found += ints[index]
    return found
