"""The in-container runner: PID 1 of every sandbox container. It supervises; it runs no test.

Its ``main`` is the entry point of the runtime's bundle (``python3 -I -S``, the bundle on stdin:
runtime/importer.py); standard library only, it imports the runtime's own modules and nothing
else of rollstream.

Protocol (over the container's attach stream, one JSON object per line):

* runner -> host, once at start: ``{"ready": true, "python", "clean", "sysv_ipc_objects",
  "tasks_counted", "channels_guarded"}``
* host -> runner: a job ``{"id", "nonce", "setup", "code", "tests", "names", "modules",
  "entry_point", "program", "trust", "rules", "timeout_s", "memory_mb",
  "output_bytes", "tail_bytes", "file_bytes"}``, and for a turn of a multi-turn episode
  ``"files"``, ``"workspace_bytes"``, ``"collect_files"`` (consumers/executor/runtime/workspace.py)
* runner -> host: ``{"id", "nonce", "exit_code", "signal", "duration_s", "timed_out",
  "output_limit", "oom_killed", "output_bytes", "stdout_tail", "stderr_tail", "events",
  "violations", "clean"}`` (+ ``"files"``, ``"workspace_truncated"``, ``"workspace_problem"``)

Processes. PID 1 warms up (imports, one made-up exchange of each side, so that what every job
runs is built and specialised once and shared copy-on-write), then forks, once, three *zygotes*
that have never loaded a job and never will: the judge zygote (which installs the judge's
guards, consumers/executor/runtime/judge.py), the candidate zygote, and the pytest zygote (a judge
zygote that warms the image's pytest up when the container's first pytest file comes: the judges
of pytest files, runtime/pytests.py). Per judged job (``trust`` ``judge``) each
forks one fresh process: a *judge* and a *candidate* (consumers/executor/runtime/candidate.py); they talk over
two pipes and PID 1 never reads a word of it. Each reads only its own part of the job from its
own in-memory file, written by PID 1 before the fork, so the candidate's memory holds no test
and no expected value. When the judge exits PID 1 ends the candidate (its exit status means
nothing once every test has a verdict). The events are the judge's, and count only if it
exited by itself with status 0 after ``done``: a judge killed, stopped or failing fails the job
(``judge_killed``, ``judge_stopped``, ``judge_failed``). ``trust`` ``in_process``: one child of
the candidate zygote runs setup, code and tests together (consumers/executor/runtime/inprocess.py), its reports
keyed per job. PID 1 enforces the deadline and the output cap, then cleans ``/work`` and
replies.

PID 1 and the zygotes are non-dumpable (same-uid code cannot ptrace them or open
``/proc/<pid>/{mem,fd}``). PID 1 as the namespace's init has no handlers and so cannot be
signalled from inside; the judge zygote, and so every judge, ignores every catchable signal; the
candidate zygote keeps Python's dispositions, which its candidates inherit (it can be killed by
the candidates, like a judge: the job then fails, and the container is replaced).

Cleanup: when the container's pids cgroup counts exactly PID 1, the zygotes and the children forked ahead
nothing outlived the job, the usual case, checked with one read. Otherwise something did (a
daemonised child, a fork bomb): PID 1 ``kill(-1)``s everything but itself (atomic with respect
to fork), zygotes included, reaps, and replies ``clean: false``: the host replaces the
container. Every pipe the job shared is drained after it, and the runner's open files it held
(stdout, stderr, reports) are reset to what they were before any job (status flags, O_ASYNC and
so its signal owner, pipe sizes), so nothing a job leaves reaches the next one. A runner whose
zygote did not fork its child ahead after a job refuses the next (``"ran": false``): the host
runs that job elsewhere and replaces the container.
"""

import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import socket
import sys
import time

from rollstream.consumers.executor.runtime.cleanup import (
    SETTLE_S,
    cleanup,
    install_seccomp,
    kill_all,
    sysv_ipc_objects,
)
from rollstream.consumers.executor.runtime.relay import RELAY_PORT, start_relay
from rollstream.consumers.executor.runtime.warmup import warm_up
from rollstream.consumers.executor.runtime.workspace import (
    WORK,
    collect_workspace,
    restore_workspace,
)
from rollstream.consumers.executor.runtime.zygotes import (
    MAX_TESTS,
    PR_SET_DUMPABLE,
    ZYGOTE_GRACE_S,
    ZYGOTES,
    await_zygotes,
    drop_to,
    move_high,
    prefork,
    pytest_warm,
    start_zygotes,
    write_part,
)

CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK,
    "TMPDIR": WORK,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
MAX_REPORT_BYTES = 1 << 20
REPORT_DRAIN_S = 0.02  # how often the report pipe is emptied while a job runs (it wakes nobody)
PYTEST_WARM_S = 60.0  # the most a first pytest file waits for the pytest zygote to be warm (gVisor: seconds)
CANDIDATE_STATUS_S = 0.5  # a candidate that died on its own before its judge ended: its status is awaited this long
# A child forked ahead that ended during a job without saying its pid (killed by the job's candidate,
# the one process of its uid, between taking the job's command and reporting): if its zygote says no
# new pid by then, the child had taken the job and its end is the job's process's end
AHEAD_TAKEN_S = 0.5
# The container's pids cgroup counter (v1, v2): every task in the container, zombies included.
TASK_COUNTERS = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")
# OOM kills in the container's memory cgroup (v2, or v1 on kernels >= 4.13).
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


# A failing ``assert left <op> right`` of the tests says what both sides were, as pytest's
# assertion rewriting does: the test's code is compiled as ``assert (l := left) <op> (r := right),
# EXPLAIN(l, "<op>", r)``: the same evaluations in the same order, and a message built by the
# judge from plain data only (runtime/judge.py ``explain``), never by the completion's code.
EXPLAIN = "__assert_explain__"
_OPS = {"Eq": "==", "NotEq": "!=", "Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=", "Is": "is", "IsNot": "is not",
        "In": "in", "NotIn": "not in"}


def explained_asserts(tree):
    """``tree`` with every one-comparison ``assert`` that has no message of its own explained."""
    import ast

    class Explain(ast.NodeTransformer):
        count = 0

        def visit_Assert(self, node):
            test = node.test
            if node.msg is not None or not isinstance(test, ast.Compare) or len(test.ops) != 1:
                return node
            op = _OPS.get(type(test.ops[0]).__name__)
            if op is None:
                return node
            Explain.count += 1
            left, right = f"__assert_l{Explain.count}__", f"__assert_r{Explain.count}__"
            compare = ast.Compare(left=ast.NamedExpr(target=ast.Name(left, ast.Store()), value=test.left),
                                  ops=test.ops,
                                  comparators=[ast.NamedExpr(target=ast.Name(right, ast.Store()),
                                                             value=test.comparators[0])])
            message = ast.Call(func=ast.Name(EXPLAIN, ast.Load()),
                               args=[ast.Name(left, ast.Load()), ast.Constant(op), ast.Name(right, ast.Load())],
                               keywords=[])
            return ast.copy_location(ast.Assert(test=ast.copy_location(compare, test), msg=message), node)

    return ast.fix_missing_locations(Explain().visit(tree))


def compile_trusted(host, source, filename):
    """The task's own code (setup, tests), compiled once per runner and cached: every sample of
    a group shares them. Compiling runs nothing. A compile error is kept as text. Tests are
    compiled with their asserts explained (``explained_asserts``)."""
    key = (source, filename)
    compiled = host.compiled.get(key)
    if compiled is None:
        try:
            compiled = compile(source, filename, "exec")
            if filename.startswith("<test"):
                import ast

                try:
                    compiled = compile(explained_asserts(ast.parse(source, filename)), filename, "exec")
                except (SyntaxError, ValueError, MemoryError, RecursionError):
                    pass  # the plain compile stands
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            compiled = f"{type(exc).__name__}: {exc}"
        if len(host.compiled) >= 4096:
            host.compiled.clear()
        host.compiled[key] = compiled
    return compiled


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
        # reports): reset after each job to what they were before any (``_reset_shared_fds``)
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


# ---------------------------------------------------------------- the zygote and the job's processes
# ---------------------------------------------------------------- PID 1's side of a job

class Capture:
    """The tail of one output stream, and how many bytes it produced."""

    def __init__(self, tail_bytes):
        self.tail_bytes = tail_bytes
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        self.total += len(data)
        self.tail += data
        if len(self.tail) > 2 * self.tail_bytes:
            del self.tail[: len(self.tail) - self.tail_bytes]

    def text(self):
        return bytes(self.tail[-self.tail_bytes :]).decode("utf-8", "replace")


# Tests only (a runner started with --test-hooks): ways to make the machinery fail on purpose.
# lose_zygotes: the zygotes are lost at the end of the job (as when cleanup must kill them);
# lose_zygotes_idle: ... after its reply, while the container waits; exit_before_reply: PID 1
# exits with the job done but unanswered; raise: PID 1 fails handling the job; judge_slow_to_say_pid:
# the judge waits JUDGE_PID_DELAY_S between taking the job and saying its pid (a candidate that kills
# it then: the runner must not wait for a pid that never comes); stop_zygote_idle: the candidate
# zygote is stopped after the reply, before it forks the next child ahead (a zygote that no
# longer answers, whatever stopped it: the next job must be refused, never charged with it).
RUNNER_HOOKS = ("lose_zygotes", "lose_zygotes_idle", "exit_before_reply", "raise", "judge_slow_to_say_pid",
                "stop_zygote_idle")
JUDGE_PID_DELAY_S = 0.5


def _lose_zygotes(host):
    host.drop_zygotes()
    kill_all()


def _stop_zygote(host, role):
    """Tests only: stop the zygote of ``role`` (start_zygotes forks them in ZYGOTES' order)."""
    os.kill(list(host.zygotes)[ZYGOTES.index(role)], signal.SIGSTOP)


def run_job(host, job):
    """Hand one job to the zygotes, supervise it, clean up; returns the reply dict.

    A container whose zygotes are gone cannot run a job (a zygote must never hold one, and the
    runner's heap has held jobs), nor one whose zygote did not fork its child ahead after the last
    job (``_unfit``: it no longer answers, whatever the last job did to it): the reply then says
    ``"ran": false`` with why in ``"unfit"``, and the host runs the job on another container and
    replaces this one: nothing of the job ran, so no job is charged with what an earlier one left.
    The job that lost them says so itself: its reply carries ``"unfit"`` and ``clean: false``, so
    the host retires the container at once."""
    if not host.zygotes or host.unfit:
        return _refusal(job, host.unfit or "zygotes_lost")
    run = JobRun(host, job)  # compiled, limited, its captures ready: before the clock starts
    _open_workspace_and_egress(host, run)
    _warm_pytest_zygote(host, run)
    supervisor = _start(host, run)  # the clock starts; its processes take the job
    run.finished(*supervisor.finish())  # every process of the job has ended (or a zygote is lost)
    _clean_up(host, run)
    _drain_pipes(host, run)
    _collect(host, run)
    return _report(host, run)


class JobRun:
    """One job as PID 1 runs it: what was sent, what was made of it before any fork, and what
    its processes left (the supervisor's result, the violations seen, what cleanup found)."""

    def __init__(self, host, job):
        self.job = job
        self.setup = compile_trusted(host, job["setup"], "<setup>") if job.get("setup") else None
        self.tests = [compile_trusted(host, t, f"<test {i}>") for i, t in enumerate(job.get("tests", []))]
        self.timeout = float(job.get("timeout_s", 5.0))
        self.limits = (
            host.vsz() + (int(job.get("memory_mb", 256)) << 20),  # address space
            int(self.timeout) + 2,  # CPU seconds
            int(job.get("file_bytes", 64 << 20)),  # file size
        )
        self.code, self.program = job.get("code", ""), bool(job.get("program", False))
        self.workspace_bytes = int(job.get("workspace_bytes", 0))
        self.workspace_problem = None
        self.cap = int(job.get("output_bytes", 65536))
        tail = int(job.get("tail_bytes", 4000))
        self.out, self.err, self.rep = Capture(tail), Capture(tail), Capture(MAX_REPORT_BYTES)
        self.relay = host.relay if job.get("egress_token") else None
        self.pytest_files = bool(job.get("pytest"))  # each test a pytest file: its judge is the pytest zygote's
        self.key = None  # trust in_process: the key its reports carry (others are forgeries)
        self.start = None
        self.collected = []  # collect_files: (files, truncated), as runtime/workspace.py lists them
        self.result = self.judge_status = self.problem = None
        self.zygote_lost = False
        self.violations = []
        self.survivors = self.halted = None
        self.problems = []

    def finished(self, result, judge_status, problem):
        """What the supervisor saw: a zygote lost is a violation of its own."""
        self.result, self.judge_status, self.problem = result, judge_status, problem
        self.zygote_lost = bool(problem and problem.startswith("runner_zygote"))
        if self.zygote_lost:
            self.violations.append(problem)


def _refusal(job, unfit):
    """The reply of a runner that cannot run a job: nothing of it ran."""
    return {"id": job.get("id"), "nonce": job.get("nonce"), "ran": False, "unfit": unfit, "clean": False}


def _open_workspace_and_egress(host, run):
    """An episode's files written into /work; the job's token at the egress relay."""
    if run.job.get("files"):
        run.workspace_problem = restore_workspace(run.job["files"], run.workspace_bytes)
    if run.relay is not None:
        run.relay.begin(str(run.job["egress_token"]))


def _warm_pytest_zygote(host, run):
    """A job of pytest files starts once the pytest zygote is warm: the wait is not the job's time."""
    if not run.pytest_files or host.pytest_ready:
        return
    if not host.pytest_asked:  # it imports pytest when the container's first pytest file comes
        socket.send_fds(host.command_socket(b"P"), [b"w"], [])
        host.pytest_asked = True
    await_zygotes(host, set(), pytest=True, wait_s=PYTEST_WARM_S)


def _start(host, run):
    """The clock starts, each side's part is written, the zygotes' children take the job."""
    run.start = time.monotonic()
    supervisor = Supervisor(host, run.start + run.timeout, run.cap, run.out, run.err, run.rep,
                            judge=b"P" if run.pytest_files else b"J")
    if run.job.get("trust") == "in_process":
        _start_in_process(host, run, supervisor)
    else:
        _start_judged(host, run, supervisor)
    return supervisor


def _start_in_process(host, run, supervisor):
    """One child of the candidate zygote runs setup, code and tests, its reports keyed."""
    run.key = os.urandom(8).hex()
    report_fd = 64 + os.urandom(1)[0] % 128  # a random descriptor above the runner's own
    write_part(host.candidate_part, (run.code, run.setup, run.tests, run.key, report_fd, run.limits, run.program,
                                     run.cap, run.pytest_files))
    socket.send_fds(host.command_socket(b"C"), [b"i"], [])
    supervisor.expect(b"C")


def _start_judged(host, run, supervisor):
    """A judge and a candidate, each with its own part, over two pipes of this job's own."""
    job = run.job
    names = [str(n) for n in job.get("names", [])]
    modules = [str(n) for n in job.get("modules", [])]
    rules = job.get("rules") if isinstance(job.get("rules"), dict) else {}
    judge_part = (run.setup, run.tests, names, str(job.get("entry_point", "")), modules, rules, run.pytest_files)
    hook = job.get("test_hook") if host.test_hooks else None
    slow = JUDGE_PID_DELAY_S if host.test_hooks and job.get("runner_hook") == "judge_slow_to_say_pid" else 0.0
    write_part(host.judge_part, (judge_part, run.limits, hook, slow))
    write_part(host.candidate_part, (run.code, run.setup, names, run.program, run.cap, run.limits))
    req_r, req_w = os.pipe()  # judge -> candidate
    resp_r, resp_w = os.pipe()  # candidate -> judge
    try:
        socket.send_fds(host.command_socket(b"C"), [b"c"], [req_r, resp_w])
        socket.send_fds(host.command_socket(supervisor.judge), [b"j"], [resp_r, req_w])
        supervisor.expect(b"C", supervisor.judge)
    finally:
        for fd in (req_r, req_w, resp_r, resp_w):
            os.close(fd)


def _clean_up(host, run):
    """Nothing of the job left: its processes, its files (collected first when asked), its
    connections; what it left running or stopped is a violation."""
    def collect():
        run.collected.extend(collect_workspace(run.workspace_bytes))

    # a zygote lost or stopped reaps nothing: no waiting for its children, the container goes anyway
    run.survivors, run.problems = cleanup(host, collect=collect if run.job.get("collect_files") else None,
                                          settle_s=0 if run.zygote_lost else SETTLE_S)
    if run.relay is not None:  # after cleanup: no process of the job is left to connect again
        run.relay.end()
    result = run.result
    if run.survivors and not result["timed_out"] and not result["output_limit"] and not run.zygote_lost:
        run.violations.append(f"stray_processes:{run.survivors}")  # a daemonised child, a fork bomb
    run.halted = _zygotes_halted(host)  # stopped or ended by the job, though the job did not need them
    if run.halted and not run.zygote_lost:
        run.violations.append(run.halted)
    _reset_shared_fds(host)  # nothing of the job is left to set them again: before PID 1 reads its pipes


def _drain_pipes(host, run):
    """Every writer is gone now (the zygotes write only pids and statuses): empty the pipes."""
    pipes = ((host.out_r, run.out), (host.err_r, run.err), (host.jout_r, run.out), (host.jerr_r, run.err),
             (host.rep_r, run.rep), (host.pid_r, Capture(0)))
    for fd, capture in pipes:
        if not _drain(fd, capture):
            run.problems.append("cleanup_failed:pipes")


def _collect(host, run):
    """The job's output, its events (a judge's only if it finished by itself), its OOM kills."""
    result = run.result
    result["duration_s"] = time.monotonic() - run.start
    result["stdout_tail"], result["stderr_tail"] = run.out.text(), run.err.text()
    result["output_bytes"] = run.out.total + run.err.total
    if run.key is not None:
        result["events"] = _events(run.rep, run.key)
    else:
        events = _events(run.rep, None)
        over = result["timed_out"] or result["output_limit"] or run.zygote_lost
        verdict = _judge_verdict(run.judge_status, events, run.problem)
        if verdict is not None and not over:
            run.violations.append(verdict)
        result["events"] = events if verdict is None or over else []
    oom_kills = host.read_oom_kills()
    result["oom_killed"] = oom_kills > host.oom_kills
    host.oom_kills = oom_kills


def _report(host, run):
    """The reply: the violations, whether the container is clean for another job, its files."""
    result, job = run.result, run.job
    if host.test_hooks and job.get("runner_hook") == "lose_zygotes":
        _lose_zygotes(host)
    result["violations"] = run.violations + run.problems
    result["clean"] = (not run.problems and not run.zygote_lost and not run.survivors and not run.halted
                       and bool(host.zygotes))
    if not host.zygotes:  # unfit for another job: said here, by the job that lost them
        result["unfit"] = "zygotes_lost"
    if job.get("collect_files") and run.collected:
        result["files"], result["workspace_truncated"] = run.collected
    if run.workspace_problem:
        result["workspace_problem"] = run.workspace_problem
    result["id"] = job.get("id")
    result["nonce"] = job.get("nonce")
    return result


def _judge_verdict(status, events, problem):
    """None when the judge finished by itself (``done``, exit status 0); else the violation."""
    if problem == "judge_stopped":
        return "judge_stopped"
    if status is None:
        return "judge_failed:no_status"
    if os.WIFSIGNALED(status):
        return f"judge_killed:{os.WTERMSIG(status)}"
    if os.WEXITSTATUS(status) != 0:
        return f"judge_failed:{os.WEXITSTATUS(status)}"
    if not events or events[-1].get("e") != "done":
        return "judge_failed:no_done"
    return None


class Supervisor:
    """Watches one job: pumps its output, enforces the deadline and the output cap, ends the
    candidate once the judge has exited, and waits for the zygotes' reports."""

    def __init__(self, host, deadline, cap, out, err, rep, judge=b"J"):
        self.host, self.deadline, self.cap = host, deadline, cap
        self.judge = judge  # the judge's role: J, or P (a pytest file's judge, from the pytest zygote)
        self.out, self.err, self.rep = out, err, rep
        self.result = {"exit_code": None, "signal": None, "timed_out": False, "output_limit": False}
        self.status = b""
        self.pids = b""
        self.waiting = set()  # roles whose process has not ended yet
        self.processes = {}  # role -> pid
        self.ahead = {}  # role -> pid of its child forked ahead when the job was sent (the one to take it)
        self.ahead_ended = {}  # role -> (wait status, when it counts): that child ended before saying its pid
        self.statuses = {}  # role -> wait status
        self.problem = None
        self.killed_at = None
        self.ended = False  # the candidate was ended by the runner after the judge exited
        self.candidate_due = None  # the candidate had died on its own when the judge ended: its status is due by then
        self.streams = {host.out_r: out, host.err_r: err, host.jout_r: out, host.jerr_r: err}

    def expect(self, *roles):
        """The roles whose processes take this job (their commands sent): each says its pid when
        it takes it. A child forked ahead that died before taking it has no say (its zygote forks
        anew, and that child says its pid); one that ended before saying its pid took it, unless a
        new pid comes within AHEAD_TAKEN_S."""
        self.waiting.update(roles)
        for role in roles:
            pid = self.host.ahead.pop(role, None)  # the child forked ahead for it takes this job (none for P)
            if pid is not None:
                self.ahead[role] = int(pid)

    def finish(self):
        """Pump until every process of the job has ended: (result, judge status, problem)."""
        while self.waiting and not (self.problem or "").startswith("runner_zygote"):
            self.pump()
        return self.result, self.statuses.get(self.judge), self.problem

    def kill(self):
        if self.killed_at is None:
            self.killed_at = time.monotonic()
        self._pids()
        for role in (self.judge, b"C"):
            pid = self.processes.get(role)
            if pid is not None and role in self.waiting:
                _kill(pid)

    def pump(self):
        host, result = self.host, self.result
        now = time.monotonic()
        if self.killed_at is None:
            if now >= self.deadline:
                result["timed_out"] = True
            if result["timed_out"] or result["output_limit"] or self.problem == "judge_stopped":
                self.kill()
        elif now - self.killed_at > ZYGOTE_GRACE_S:
            self.problem = "runner_zygote_unresponsive"
            return
        else:
            self.kill()  # processes whose pid arrived after the kill
        if self.candidate_due is not None and now >= self.candidate_due and b"C" in self.waiting:
            self._end_candidate()  # its status never came: ended as any other
        if self.ahead_ended:
            self._pids()  # a new pid: the zygote forked anew (its child forked ahead had not taken the job)
        for role, (status, due) in list(self.ahead_ended.items()):
            if now >= due:  # no new pid came: the child forked ahead had taken the job
                del self.ahead_ended[role]
                self._role_ended(role, status)
        until = self.deadline if self.killed_at is None else self.killed_at + ZYGOTE_GRACE_S
        if self.candidate_due is not None:
            until = min(until, self.candidate_due)
        for _, due in self.ahead_ended.values():
            until = min(until, due)
        wait = max(min(until - now, REPORT_DRAIN_S), 0.001)
        for fd, _ in host.poller.poll(wait * 1000):
            if fd in host.zygotes.values():
                self.problem = "runner_zygote_died"
            elif fd == host.status_r:
                self._status()
            elif not _read_some(fd, self.streams[fd]):  # the runner holds the write ends
                raise RuntimeError("an output pipe of the job was closed")
        _read_some(host.rep_r, self.rep)
        if self.killed_at is None and (self.out.total + self.err.total > self.cap or self.rep.total > MAX_REPORT_BYTES):
            result["output_limit"] = True

    def _pids(self):
        """The pids the zygotes reported: they wait in their pipe until a kill needs them."""
        try:
            self.pids += os.read(self.host.pid_r, 256)
        except BlockingIOError:
            return
        while b"\n" in self.pids:
            line, self.pids = self.pids.split(b"\n", 1)
            role, pid = line.split()
            if role in self.waiting:
                self.processes[role] = int(pid)
                self.ahead_ended.pop(role, None)  # its zygote forked anew: this one took the job

    def _status(self):
        try:
            self.status += os.read(self.host.status_r, 256)
        except BlockingIOError:
            return
        self._pids()
        while b"\n" in self.status:
            line, self.status = self.status.split(b"\n", 1)
            fields = line.split()
            if pytest_warm(self.host, fields):
                continue
            # "R S pid" / "R E pid status"; a line about another process (a child forked ahead
            # that never got this job) is not this job's
            if len(fields) < 3:
                continue
            role, pid = fields[0], int(fields[2])
            if self.processes.get(role) != pid:
                if len(fields) == 4 and fields[1] == b"E" and role in self.waiting and role not in self.processes \
                        and self.ahead.get(role) == pid:
                    self.ahead_ended[role] = (int(fields[3]), time.monotonic() + AHEAD_TAKEN_S)
                continue
            if fields[:2] == [self.judge, b"S"]:
                self.problem = self.problem or "judge_stopped"
            elif len(fields) == 4 and fields[1] == b"E":
                self._role_ended(role, int(fields[3]))

    def _role_ended(self, role, status):
        """The job's process of ``role`` ended with wait status ``status``."""
        self.waiting.discard(role)
        self.statuses[role] = status
        if role == self.judge and b"C" in self.waiting:  # the verdicts are in: end the candidate
            self._pids()
            if _ended(self.processes.get(b"C", 0)):  # it died on its own first: its status is its own
                self.candidate_due = time.monotonic() + CANDIDATE_STATUS_S
            else:
                self._end_candidate()
        elif role == b"C" and self.killed_at is None and not self.ended:
            self._candidate_status(status)

    def _end_candidate(self):
        self.ended = True
        _kill(self.processes.get(b"C", 0))

    def _candidate_status(self, status):
        """The candidate's own end (not the runner's)."""
        if os.WIFSIGNALED(status):
            self.result["signal"] = os.WTERMSIG(status)
        elif os.WIFEXITED(status):
            self.result["exit_code"] = os.WEXITSTATUS(status)


def _ended(pid):
    """Whether the process ``pid`` has ended (a zombie, or reaped already): a candidate that died
    by a signal before its judge exited keeps that signal as its verdict's, whichever zygote
    reports first."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032


def _shared_state(host):
    """What the descriptors a job's processes share with the runner look like before any job:
    fd -> (status flags, pipe size)."""
    return {fd: (fcntl.fcntl(fd, fcntl.F_GETFL), fcntl.fcntl(fd, F_GETPIPE_SZ)) for fd in host.shared}


def _reset_shared_fds(host):
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


def _kill(pid):
    """SIGKILL a job's process: its process group (it leads one), then itself."""
    if pid <= 0:
        return
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_some(fd, capture):
    """Read what is there; False at EOF."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return True
    if not data:
        return False
    capture.add(data)
    return True


def _drain(fd, capture, limit=2 << 20):
    """After every writer is dead: read what is left in the pipe (bounded). False when it is not
    empty after ``limit`` bytes."""
    read = 0
    while read < limit:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return True
        read += len(data)
        capture.add(data)
    return False


def _events(capture, key):
    """The events on the report pipe (with ``key``: only those carrying it; others are forgeries)."""
    events = []
    for line in bytes(capture.tail).splitlines()[: 4 * MAX_TESTS + 8]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if key is not None and event.pop("k", None) != key:
            continue
        events.append(event)
    return events


def _zygotes_halted(host):
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


def _unfit(host):
    """Why this runner cannot serve the next job (None: it can), once the last one is answered and
    the zygotes were asked to fork ahead: every zygote that forks a job's processes must have its
    child waiting. One that did not within ZYGOTE_GRACE_S no longer answers (stopped, killed, stuck):
    a job given to it would wait for processes that never come, and lose by no doing of its own."""
    missing = [role.decode() for role in (b"C", b"J") if role not in host.ahead]
    return f"zygote_unresponsive:{','.join(missing)}" if missing else None


def _reply(obj):
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def channels_guarded(host):
    """Whether the candidate is kept out of PID 1's descriptors: a child with the candidate's uid
    tries to open the judge's part of the job (its tests) through ``/proc/1/fd``. Linux refuses
    (PID 1 is non-dumpable); gVisor's kernel of 2022-12-19 lets one uid open another process's
    descriptors (a same-uid one's all, another uid's by the file's mode), so there the jobs run
    under uids of their own and the parts are 0600. A container that fails this is refused by the
    host (consumers/executor/pool.py)."""
    pid = os.fork()
    if pid == 0:
        try:
            drop_to(host)
            os.open(f"/proc/1/fd/{host.judge_part}", os.O_RDONLY)  # the judge's part: the tests
        except OSError:
            os._exit(0)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _scrub_environ(libc):
    """Overwrite the environment PID 1 was started with (the strings the kernel copied onto its
    stack, what ``/proc/1/environ`` reads) with NUL bytes, and empty the C library's list.
    os.environ.clear() only unsets the names: the strings stay where /proc reads them. Under runc
    /proc refuses another process's environ (PID 1 is non-dumpable); gVisor's kernel of
    2022-12-19 lets any process read it (the file is 0444 and dumpability is not checked), and
    every zygote and job forks this memory. Nothing of it is secret (the pool's limits, the proxy
    socket's path), but what the container was started with is the executor's, not the job's."""
    environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
    libc.strlen.restype, libc.strlen.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    index = 0
    while environ and environ[index]:
        ctypes.memset(environ[index], 0, libc.strlen(environ[index]))
        index += 1
    libc.clearenv()


def main():
    # Python installs a SIGINT handler; with one installed, code in the container could
    # deliver SIGINT to PID 1. Default dispositions make init immune to in-namespace signals.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import builtins

    builtins.exit = builtins.quit = sys.exit  # what `site` would add (the runner runs with -S)
    host = Host()
    host.test_hooks = "--test-hooks" in sys.argv
    host.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    nproc = os.environ.get("ROLLSTREAM_NPROC")  # runsc: the process limit, inside gVisor's kernel
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (int(nproc), int(nproc)))
    egress = os.environ.get("ROLLSTREAM_EGRESS", "")  # a task with a network allowlist: the proxy's socket
    _scrub_environ(host.libc)
    os.environ.clear()  # children inherit exactly this environment
    os.environ.update(CHILD_ENV)
    if egress:
        proxy = f"http://127.0.0.1:{RELAY_PORT}"
        os.environ.update(HTTP_PROXY=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, https_proxy=proxy)
    os.chdir(WORK)
    os.umask(0o077)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # inherited by every job (the container's too)
    _, problems = cleanup(host)
    if host.tasks() != 1:  # not alone after cleanup (threads?): never trust the count
        host.tasks_fd = None
    warm_up()
    install_seccomp(host)  # before the zygotes fork: every job's process inherits it
    guarded = channels_guarded(host)
    start_zygotes(host)
    host.relay = start_relay(host, egress)  # a thread: after the last fork PID 1 makes
    _reply({"ready": True, "egress": host.relay is not None, "python": sys.version.split()[0], "clean": not problems,
            "sysv_ipc_objects": sysv_ipc_objects(host.libc), "tasks_counted": host.tasks_fd is not None,
            "channels_guarded": guarded})
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return  # the host went away (StdinOnce): exit, the container stops
        try:
            job = json.loads(line)
        except ValueError as exc:
            _reply({"error": f"bad request: {exc}"})
            continue
        hook = job.get("runner_hook") if host.test_hooks and isinstance(job, dict) else None
        try:
            if hook == "raise":
                raise RuntimeError("failed on purpose (runner_hook)")
            reply = run_job(host, job)
            if hook == "exit_before_reply":
                os._exit(3)
            _reply(reply)
            if hook == "stop_zygote_idle":
                _stop_zygote(host, b"C")
            if host.zygotes:  # the next job's processes, forked while the host prepares it
                prefork(host, (b"C", b"J"))  # a role whose child still waits is skipped
                host.unfit = _unfit(host)  # said in the next job's refusal: no message more per job
            if hook == "lose_zygotes_idle":
                _lose_zygotes(host)
        except Exception as exc:  # a runner bug must not leave the host waiting
            _reply({"id": job.get("id"), "nonce": job.get("nonce"), "error": f"runner: {type(exc).__name__}: {exc}",
                    "clean": False})
