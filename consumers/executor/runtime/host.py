"""PID 1's host state (:class:`Host`): what the runner prepares once, before any fork (the job's
pipes and parts, the zygotes' command sockets, the container's cgroup counters), the runner's
open files the job's processes share and their reset after each job, and what PID 1 knows of its
zygotes (halted during a job, or unfit for the next).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module).
"""

import ctypes
import fcntl
import os
import select
import socket

from rollstream.consumers.executor.runtime.cleanup import kill_all
from rollstream.consumers.executor.runtime.zygotes import ZYGOTES, move_high

# The container's pids cgroup counter (v1, v2): every task in the container, zombies included.
TASK_COUNTERS = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")
# OOM kills in the container's memory cgroup (v2, or v1 on kernels >= 4.13).
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


class Host:
    """What the runner prepares once, before any fork: work done here is not paid per job."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.prctl = self.libc.prctl  # resolved once (each ctypes lookup makes objects)
        self.page = os.sysconf("SC_PAGE_SIZE")
        # An unread text stream on fd 0: in a child, fd 0 is /dev/null, so this reads EOF.
        self.stdin = open(0, closefd=False)
        self.null = os.open("/dev/null", os.O_RDWR)
        self.compiled = {}
        self.jobs = 0
        self._vsz = 0
        self.tasks_fd = _open_first(TASK_COUNTERS)
        self.oom_fd = _open_first(OOM_COUNTERS)
        self.oom_kills = self.read_oom_kills()
        # Each child's part of the job: an in-memory file PID 1 rewrites per job, read by the
        # child after the fork and closed before any job code runs.
        self.judge_part = os.memfd_create("judge")
        self.candidate_part = os.memfd_create("candidate")
        for part in (self.judge_part, self.candidate_part):  # a memfd is born 0777, and gVisor lets any
            os.fchmod(part, 0o600)  # uid open another process's through /proc/<pid>/fd by its mode
        # The job's pipes (PID 1 reads the output and the report; the judge and the candidate
        # talk over req/resp), the zygote's commands, the job's pids and statuses.
        self.out_r, self.out_w = os.pipe()  # the candidate's stdout
        self.err_r, self.err_w = os.pipe()
        self.jout_r, self.jout_w = os.pipe()  # the judge's own stdout/stderr
        self.jerr_r, self.jerr_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()  # the judge's (or in-process child's) events
        # PID 1 -> each zygote: a command, and for a judged job the ends of that job's own pipes
        # between judge and candidate (fresh per job, held by nobody else: each sees the other's
        # exit as an end of file, and nothing a job leaves in them reaches another).
        # role -> (PID 1's end, the zygote's end)
        self.commands = {role: socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for role in ZYGOTES}
        self.pid_r, self.pid_w = os.pipe()  # zygotes -> PID 1: "J <pid>" / "C <pid>"
        self.status_r, self.status_w = os.pipe()  # zygotes -> PID 1: "J E <status>", "J S", ...
        self.null = move_high(self.null)  # every descriptor here sits above the ones a job's process uses
        self.judge_part, self.candidate_part = move_high(self.judge_part), move_high(self.candidate_part)
        (self.out_r, self.out_w, self.err_r, self.err_w, self.jout_r, self.jout_w, self.jerr_r, self.jerr_w,
         self.rep_r, self.rep_w, self.pid_r, self.pid_w, self.status_r, self.status_w) = (
            move_high(fd) for fd in (self.out_r, self.out_w, self.err_r, self.err_w, self.jout_r, self.jout_w, self.jerr_r,
                                 self.jerr_w, self.rep_r, self.rep_w, self.pid_r, self.pid_w, self.status_r, self.status_w))
        for fd in (self.out_r, self.err_r, self.jout_r, self.jerr_r, self.rep_r, self.pid_r, self.status_r):
            os.set_blocking(fd, False)
        # the runner's open files every job's processes get as their own descriptors (stdout, stderr,
        # reports): reset after each job to what they were before any (``reset_shared_fds``)
        self.shared = (self.out_w, self.err_w, self.jout_w, self.jerr_w, self.rep_w)
        self.shared_state = _shared_state(self)
        self.poller = select.poll()
        for fd in (self.out_r, self.err_r, self.jout_r, self.jerr_r, self.status_r):
            self.poller.register(fd, select.POLLIN)
        self.zygotes = {}  # pid -> the read end of each live zygote's pipe (hangs up when it exits)
        self.alive_w = None  # in a zygote: the write end of its own pipe (closed in each child)
        self.own = None  # in a zygote and its children: the zygote's command socket
        self.ahead = {}  # role -> pid of its zygote's child forked ahead, waiting for its job
        self.unfit = None  # why this runner cannot serve another job (a zygote that did not fork ahead)
        self.zygotes_started = False
        self.pytest_ready = False  # the pytest zygote said it is warm (runtime/zygotes.py "P R")
        self.pytest_asked = False  # it was told to warm up ("w", at the first pytest file)
        self.test_hooks = False
        self.separated = os.getuid() == 0  # jobs under uids of their own (runtime/zygotes.py JOB_IDS)
        self.threads = 0  # PID 1's threads besides its own: the egress relay (runtime/relay.py)
        self.relay = None

    def vsz(self):
        """The runner's address-space size (refreshed now and then: it barely changes)."""
        if self.jobs % 256 == 0:
            with open("/proc/self/statm") as f:
                self._vsz = int(f.read().split()[0]) * self.page
        self.jobs += 1
        return self._vsz

    def tasks(self):
        """How many tasks the container's pids cgroup holds (None when it cannot be read): cheap,
        sound evidence that nothing is left (zombies count until reaped, nothing can leave the
        cgroup; a ``docker exec`` from outside would only raise it)."""
        if self.tasks_fd is None:
            return None
        try:
            return int(os.pread(self.tasks_fd, 32, 0))
        except (OSError, ValueError):
            return None

    def read_oom_kills(self):
        if self.oom_fd is not None:
            try:
                for line in os.pread(self.oom_fd, 4096, 0).split(b"\n"):
                    if line.startswith(b"oom_kill "):
                        return int(line.split()[1])
            except (OSError, ValueError):
                pass
        return 0

    def command_socket(self, role):
        """PID 1's end of the command socket of the zygote ``role`` (``ZYGOTES``)."""
        return self.commands[role][0]

    def drop_zygotes(self):
        for fd in self.zygotes.values():
            self.poller.unregister(fd)
            os.close(fd)
        self.zygotes = {}
        self.ahead.clear()


def _open_first(paths):
    for path in paths:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError:
            continue
    return None


F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032


def _shared_state(host):
    """What the descriptors a job's processes share with the runner look like before any job:
    fd -> (status flags, pipe size)."""
    return {fd: (fcntl.fcntl(fd, fcntl.F_GETFL), fcntl.fcntl(fd, F_GETPIPE_SZ)) for fd in host.shared}


def reset_shared_fds(host):
    """A job's stdout, stderr and report descriptors are the runner's own open files (dup2'd into
    the job's processes), and what lives on an open file or its pipe outlives the job: its status
    flags (``O_NONBLOCK``; ``O_ASYNC``, which with ``F_SETOWN``/``F_SETSIG`` makes every later read
    of the pipe by PID 1 send a signal of the job's choice to a process of its choice: SIGSTOP or
    SIGKILL to its zygote, delivered once the job is over, left the next job a zygote that does
    not answer) and the pipe's size. Called once every process of the job is gone, before PID 1
    reads those pipes again: each back to what it was before any job (clearing ``O_ASYNC`` takes
    the file off the pipe's signal list, so its owner no longer matters)."""
    for fd, (flags, size) in host.shared_state.items():
        if fcntl.fcntl(fd, fcntl.F_GETFL) != flags:
            fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        if fcntl.fcntl(fd, F_GETPIPE_SZ) != size:
            fcntl.fcntl(fd, F_SETPIPE_SZ, size)


# ---------------------------------------------------------------- the zygotes

def zygotes_halted(host):
    """``runner_zygote_stopped`` / ``runner_zygote_died`` when a zygote was stopped or ended while
    the job ran (PID 1 is their parent: one ``waitpid`` says so, after the job's processes are gone),
    else None. A job may stop a zygote its own processes do not come from (the pytest zygote, in a
    job without pytest files): nothing in that job waits on it, and the next job that needs it
    would wait in vain, so it is this job's violation and the container is replaced."""
    halted = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
        except ChildProcessError:
            return halted
        if pid == 0:
            return halted
        if pid in host.zygotes:
            halted = "runner_zygote_stopped" if os.WIFSTOPPED(status) else "runner_zygote_died"


def unfit_reason(host):
    """Why this runner cannot serve the next job (None: it can), once the last one is answered and
    the zygotes were asked to fork ahead: every zygote that forks a job's processes must have its
    child waiting. One that did not within ZYGOTE_GRACE_S no longer answers (stopped, killed, stuck):
    a job given to it would wait for processes that never come, and lose by no doing of its own."""
    missing = [role.decode() for role in (b"C", b"J") if role not in host.ahead]
    return f"zygote_unresponsive:{','.join(missing)}" if missing else None


def lose_zygotes(host):
    """Tests only (the runner hooks ``lose_zygotes``, ``lose_zygotes_idle``): the zygotes lost, as
    when cleanup must kill them."""
    host.drop_zygotes()
    kill_all()
