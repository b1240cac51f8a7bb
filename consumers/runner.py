"""The in-container runner: PID 1 of every sandbox container, fresh forked processes per job.

This file is executed INSIDE the sandbox (``python3 -I -S -c <source>``, the source being
``plain.py``, ``candidate.py``, ``judge.py`` and this file, in that order: it uses their names);
it uses only the standard library and must not import rollstream. The executor reads the
sources and passes them on the container's command line, so the image does not need rebuilding
when they change.

Protocol (over the container's attach stream, one JSON object per line):

* runner -> host, once at start: ``{"ready": true, "python": "3.11.2", "clean", "sysv_ipc_objects",
  "tasks_counted"}``
* host -> runner: a job ``{"id", "setup", "code", "tests", "names", "entry_point", "program",
  "trust", "timeout_s", "memory_mb", "output_bytes", "tail_bytes", "file_bytes"}``, and for a
  turn of a multi-turn episode ``"files"`` (its workspace: ``[[relative path, base64]]``, written
  into the empty /work before the job is forked, paths checked, at most ``"workspace_bytes"``),
  ``"collect_files"``
* runner -> host: ``{"id", "exit_code", "signal", "duration_s", "timed_out", "output_limit",
  "oom_killed", "output_bytes", "stdout_tail", "stderr_tail", "events", "violations", "clean"}``,
  with ``collect_files`` also ``"files"`` (the regular files the job left in /work, read after
  every process of the job is gone and before the wipe; links, FIFOs and devices are never
  followed or read) and ``"workspace_truncated"``

Processes: the runner (PID 1) forks, once, a *zygote*, and per job the zygote forks one child.
With ``trust: "judge"`` (the default) the child is the *candidate*: it runs the completion and
answers calls (consumers/judge.py), and the runner itself is the *judge*: it runs the task's
setup and tests with the completion's names bound to proxies, over two pipes to the candidate
(:func:`judge`). The runner never executes completion code, holds the only copy of the tests
and expected values, is non-dumpable (same-uid code cannot ptrace it or open
``/proc/1/{mem,environ,fd}``) and, as a namespace's init, cannot be signalled from inside. With
``trust: "in_process"`` the child runs setup, code and tests in one namespace (:func:`harness`),
as a task that needs the completion's objects in its own process asks for; its verdicts travel
over a report pipe on a random descriptor, each carrying a per-job key.

The zygote holds nothing of any job: it was forked from the runner before the first job and
never reads one; the child reads its own part of the job from an in-memory file after the fork
(a candidate's part is its code, the task's setup and the names the tests use). So the
candidate's memory holds no test and no expected value, of this job or an earlier one. The
runner never forks jobs itself: a fork shares every page and whichever side writes one first
copies it, so a runner doing its per-job work (JSON, pipes, cleanup) next to a fresh fork would
copy hundreds of pages per job; the zygote only forks, waits and kills.

The child leads a new process group, gets /dev/null as stdin and pipes to the runner as stdout
and stderr; it keeps only the descriptors it needs and sets rlimits (address space, CPU, file
size). Blocking flags live on open files the job shares with the runner, so the runner resets
them before every job, and drains every pipe after it: nothing a job does to them reaches the
next one.

When the child has exited (a candidate is ended by the runner once every test has its
verdict) the zygote reaps it and makes sure nothing else is left: when the container's pids
cgroup counts exactly two tasks (the runner and the zygote) there is nothing to kill;
otherwise it SIGKILLs every other process (``kill(-1)``, which spares init and the caller, and
cannot race with fork) until none is left, and reports the exit status and how many processes
had outlived the job. At the deadline or over the output cap the runner SIGKILLs the job's
process group itself first. The runner then checks on its own that nothing but the zygote is left
(the same cgroup count, else it reaps the orphans, scans ``/proc`` and if need be kills
everything, zygote included, itself), wipes ``/work`` (restoring permissions the code removed)
and replies; ``clean: false`` tells the host to recycle the container. If the zygote dies or
stops answering (only the code can do that), the runner kills everything and reports a
``runner_zygote_*`` violation. SysV IPC and POSIX message queues need no cleaning: the
container's sysctls make creating them impossible; there is no /dev/shm.

Wake-ups are kept low: the job's pid and an in-process child's reports wait in their pipes
until the runner needs them (the pid only to kill; the reports are drained after the job, and
every ``REPORT_DRAIN_S`` while it runs); a judged job adds one wake-up per answer. Only stdout
and stderr are watched as they are written, so that the output cap acts at once.

Why PID 1: the kernel drops signals sent to a namespace's init from inside the namespace unless
init installed a handler, so the code cannot kill the runner, its judge (we install none, and
reset SIGINT).
"""

import binascii
import ctypes
import fcntl
import gc
import json
import marshal
import os
import resource
import select
import signal
import sys
import time
from json.encoder import encode_basestring_ascii as _json_string  # json.dumps' own quoting

if __name__ != "__main__":  # on the host (linters, readers): what the sandbox gets from the files above
    from rollstream.consumers.candidate import (
        Handles,
        _line_of,
        _serve,
        candidate_main,
        print_exception,
        run_program_here,
    )
    from rollstream.consumers.judge import Channel, LinkDown, PipeLink, _proxy_id, judge_main, raises
    from rollstream.consumers.plain import MAX_MESSAGE_BYTES, Encoder, ProtocolError, _text, frame, send_text

WORK = "/work"
MQUEUE = "/dev/mqueue"
CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK,
    "TMPDIR": WORK,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
MAX_REPORT_BYTES = 1 << 20
MAX_TESTS = 1000  # RewardSpec's own limit on tests per task
ZYGOTE_GRACE_S = 2.0  # how long the zygote may take to report after its job was killed
REPORT_DRAIN_S = 0.02  # how often a running job's report pipe is emptied (it wakes nobody)
PR_SET_DUMPABLE = 4
HIGH_FD = 200  # children move the descriptors they keep above this first (nofile is 256)
# The container's pids cgroup counter (v1, v2): every task in the container, zombies included.
TASK_COUNTERS = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")
# OOM kills in the container's memory cgroup (v2, or v1 on kernels >= 4.13).
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def harness(code, setup, tests, report, program=False):
    """``trust: "in_process"``: run setup, code and tests in this one process; ``report(dict)``
    writes one event. The completion shares the tests' interpreter, so it can fake its own
    verdicts: the execution record says so.

    ``setup`` and ``tests`` are the task's sources compiled by the runner (a code object, or the
    compile error as text; ``setup`` None when there is none); only the completion's ``code``
    is compiled here. With ``program`` the code is not run as a module: tests call
    ``run_program(stdin)``.
    """
    namespace = {"__name__": "solution", "__builtins__": __builtins__, "raises": raises}
    if setup is not None:
        try:
            if isinstance(setup, str):
                raise SyntaxError(setup)
            exec(setup, namespace)
        except BaseException as exc:  # the task's own setup is broken
            report({"e": "setup_error", "type": type(exc).__name__, "msg": str(exc)[:500]})
            return 1
    try:
        code = compile(code, "<completion>", "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: source contains NUL bytes
        print_exception(exc)
        report(
            {
                "e": "syntax",
                "type": type(exc).__name__,
                "line": getattr(exc, "lineno", None),
                "msg": str(getattr(exc, "msg", exc))[:500],
            }
        )
        return 1
    except (MemoryError, RecursionError) as exc:  # a pathological parse tree
        report({"e": "syntax", "type": type(exc).__name__, "line": None, "msg": "too complex to compile"})
        return 1
    report({"e": "compiled"})
    namespace["run_program"] = lambda stdin="": run_program_here(code, stdin)[0]
    if not program:
        try:
            exec(code, namespace)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: tests never ran
            print_exception(exc)
            report({"e": "code_error", "type": type(exc).__name__, "msg": _text(exc, 500), "line": _line_of(exc)})
            return 1
    report({"e": "code_ok"})
    for index, test in enumerate(tests):
        try:
            if isinstance(test, str):
                raise SyntaxError(f"the task's test does not compile: {test}")
            exec(test, namespace)
        except BaseException as exc:
            report({"e": "test", "i": index, "ok": False, "type": type(exc).__name__, "msg": _text(exc, 300)})
        else:
            report({"e": "test", "i": index, "ok": True})
    report({"e": "done"})
    return 0


def compile_trusted(host, source, filename):
    """The task's own code (setup, tests), compiled once per runner and cached: every sample of
    a group shares them. A compile error is kept as text and reported by the harness."""
    key = (source, filename)
    compiled = host.compiled.get(key)
    if compiled is None:
        try:
            compiled = compile(source, filename, "exec")
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
        # Channels shared with the zygote and, through it, with every job: the child's part of
        # the job (an in-memory file the runner rewrites per job: for a candidate only code,
        # setup and the names the tests use), the job's stdout/stderr/report pipes (read here),
        # the candidate's request and reply pipes (the judge's end is here), the zygote's
        # commands, the job's pid and the zygote's final status per job. Whatever a job leaves
        # in a pipe is drained after it, when every writer is dead.
        self.job_fd = os.memfd_create("job")
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()
        self.req_r, self.req_w = os.pipe()
        self.resp_r, self.resp_w = os.pipe()
        self.cmd_r, self.cmd_w = os.pipe()
        self.pid_r, self.pid_w = os.pipe()
        self.status_r, self.status_w = os.pipe()
        for fd in (self.out_r, self.err_r, self.rep_r, self.req_w, self.resp_r, self.pid_r, self.status_r):
            os.set_blocking(fd, False)
        # Registered once; the zygote's pidfd is added and removed as zygotes come and go.
        self.poller = select.poll()
        for fd in (self.out_r, self.err_r, self.status_r):
            self.poller.register(fd, select.POLLIN)
        self.zygote = None
        self.zygote_fd = None
        self.zygote_started = False

    def vsz(self):
        """The runner's address-space size (refreshed now and then: it barely changes)."""
        if self.jobs % 256 == 0:
            with open("/proc/self/statm") as f:
                self._vsz = int(f.read().split()[0]) * self.page
        self.jobs += 1
        return self._vsz

    def tasks(self):
        """How many tasks the container's pids cgroup holds (None when it cannot be read).

        This is cheap, sound evidence that nothing is left: the count includes every process
        and thread of the container, zombies until they are reaped, and nothing can leave the
        cgroup (cgroupfs is read-only in the container and every capability is dropped). A
        ``docker exec`` from outside would only raise it, which is the safe direction."""
        if self.tasks_fd is None:
            return None
        try:
            return int(os.pread(self.tasks_fd, 32, 0))
        except (OSError, ValueError):
            return None

    def read_oom_kills(self):
        """OOM kills in this container's memory cgroup so far."""
        if self.oom_fd is not None:
            try:
                for line in os.pread(self.oom_fd, 4096, 0).split(b"\n"):
                    if line.startswith(b"oom_kill "):
                        return int(line.split()[1])
            except (OSError, ValueError):
                pass
        return 0

    def drop_zygote(self):
        """Forget the zygote (cleanup kills it with everything else if it still lives)."""
        if self.zygote_fd is not None:
            self.poller.unregister(self.zygote_fd)
            os.close(self.zygote_fd)
        self.zygote = self.zygote_fd = None


def _open_first(paths):
    for path in paths:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError:
            continue
    return None


def start_zygote(host):
    """Fork the zygote: the process every job is forked from. Once per container: the runner's
    heap holds jobs once it has served one, and the zygote must never hold any (a candidate is
    a fork of it), so a container whose zygote died is replaced rather than given a new one.

    Why a zygote: a fork shares every page; whichever side writes a page first copies it. If
    the runner forked jobs itself, its own per-job work (JSON, pipes, cleanup) would copy a few
    hundred pages per job. The zygote does nothing but fork, wait and kill, so it writes (and
    copies) almost nothing, and the runner's pages stay private to the runner.
    """
    if host.zygote_started:
        raise RuntimeError("the zygote is gone; this container must be replaced")
    host.zygote_started = True
    pid = os.fork()
    if pid == 0:
        zygote_main(host)
    host.zygote = pid
    host.zygote_fd = os.pidfd_open(pid)
    host.poller.register(host.zygote_fd, select.POLLIN)


def zygote_main(host):
    """Per command on the command pipe ("j": a candidate; "i": an in-process child): fork the
    job's process, report its pid, wait for it, make sure nothing else is left (kill(-1) spares
    init and the zygote), report. Never returns."""
    try:
        for fd in (0, 1, 2):  # never hold the runner's channel to the host
            os.dup2(host.null, fd)
        for fd in (host.cmd_w, host.pid_r, host.status_r, host.out_r, host.err_r, host.rep_r,
                   host.req_w, host.resp_r):
            os.close(fd)
        me = str(os.getpid())
        while True:
            command = os.read(host.cmd_r, 1)
            if command not in (b"j", b"i"):
                break
            pid = os.fork()
            if pid == 0:
                (candidate_child if command == b"j" else child_main)(host)
            os.write(host.pid_w, b"%d\n" % pid)
            _, status = os.waitpid(pid, 0)
            survivors = 0
            # Only the runner and this zygote in the container: nothing outlived the job.
            # Otherwise find the survivors (zombies are the runner's to reap) and kill them.
            if host.tasks() != 2:
                survivors = len(_live_pids(me))
                for _ in range(200):
                    if not _live_pids(me):
                        break
                    try:
                        os.kill(-1, signal.SIGKILL)  # atomic w.r.t. fork; spares init and us
                    except ProcessLookupError:
                        pass
                    time.sleep(0.0005)
            os.write(host.status_w, b"%d %d\n" % (status, survivors))
    except BaseException:
        pass
    os._exit(0)


def _live_pids(*exclude):
    """Processes other than init and ``exclude`` that are not zombies."""
    live = []
    for p in os.listdir("/proc"):
        if p.isdigit() and p != "1" and p not in exclude:
            try:
                with open(f"/proc/{p}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != b"Z":
                live.append(p)
    return live


def child_main(host):
    """``trust: "in_process"``: setup, code and tests in this one forked process. Never returns."""
    status = 70
    try:
        os.setpgid(0, 0)  # its own process group (a new session would also cost a scheduler group)
        code, setup, tests, key, report_fd, limits, program = load_part(host.job_fd)
        # The report channel sits on a random descriptor and every event carries a per-job key:
        # code that just writes to fd 3 cannot fake test results (see docs/executor.md).
        _keep_fds(host, {report_fd: host.rep_w})
        _set_limits(host, limits)
        _as_solution(host)

        def report(event, _write=os.write, _encode=_event_line):
            _write(report_fd, _encode(event, key))

        status = harness(code, setup, tests, report, program)
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        status = 71
    except BaseException as exc:  # the harness itself failed: say why on stderr
        status = 72
        _say(exc)
    os._exit(status)


def candidate_child(host):
    """The candidate: the completion and its answers to the judge (the runner). Never returns.

    Everything here runs in a fresh fork, where each page written is first copied: the less
    distinct code and data it touches, the cheaper an execution (see docs/executor.md)."""
    status = 70
    try:
        os.setpgid(0, 0)
        code, setup, names, program, out_cap, limits = load_part(host.job_fd)
        _keep_fds(host, {3: host.req_r, 4: host.resp_w})
        _set_limits(host, limits)
        _as_solution(host)
        status = candidate_main(code, setup, names, program, 3, 4, out_cap)
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        status = 71
    except BaseException as exc:
        status = 72
        _say(exc)
    os._exit(status)


def _keep_fds(host, extra):
    """/dev/null as stdin, the job's pipes as stdout/stderr, ``extra`` ({target: source}) where
    asked, every other descriptor closed (the other process's pipe ends and the job files
    included)."""
    wanted = {0: host.null, 1: host.out_w, 2: host.err_w, **extra}
    moved = {target: fcntl.fcntl(source, fcntl.F_DUPFD, HIGH_FD) for target, source in wanted.items()}
    for target, source in moved.items():
        os.dup2(source, target)
    keep = sorted(wanted)
    low = 0
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


def _as_solution(host):
    # sys.stdout/sys.stderr are the runner's, never written by it (it uses os.write), so their
    # buffers are empty; fds 1 and 2 now are this job's pipes. Reusing them saves building new
    # stream objects (and the copy-on-write faults that costs) per job.
    sys.stdin = host.stdin
    sys.argv = ["solution"]


def _say(exc):
    try:
        os.write(2, f"runner child: {type(exc).__name__}: {exc}\n".encode())
    except BaseException:
        pass


def _event_line(event, key):
    """One event as a JSON line carrying the job's key.

    By hand rather than with json.dumps, which builds a fresh encoder per call: in the forked
    child that machinery alone copied some 60 pages per job. Strings are quoted by json's own C
    function (ASCII-only, like json.dumps); the names are the harness's own identifiers."""
    parts = []
    for name, value in event.items():
        if value is None:
            text = "null"
        elif value is True:
            text = "true"
        elif value is False:
            text = "false"
        elif type(value) is int:
            text = int.__repr__(value)
        else:
            text = _json_string(value if type(value) is str else _text(value, 500))
        parts.append(f'"{name}":{text}')
    parts.append(f'"k":"{key}"')
    return ("{" + ",".join(parts) + "}\n").encode()


def _set_limits(host, limits):
    # The runner is non-dumpable and fork inherits that, which would make /proc/self root-owned
    # for the code; the job's own processes may see themselves normally. (The container's
    # OomScoreAdj of 1000 is inherited, so the OOM killer already prefers them; no core dumps
    # is set once in the runner and inherited.)
    host.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    memory, cpu, fsize = limits
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


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


def run_job(host, job):
    """Hand one job to the zygote, judge it (``trust: "judge"``) or let it judge itself
    (``"in_process"``), supervise it, clean up; returns the reply dict."""
    if host.zygote is None:
        start_zygote(host)
    setup = compile_trusted(host, job["setup"], "<setup>") if job.get("setup") else None
    tests = [compile_trusted(host, t, f"<test {i}>") for i, t in enumerate(job.get("tests", []))]
    timeout = float(job.get("timeout_s", 5.0))
    limits = (
        host.vsz() + (int(job.get("memory_mb", 256)) << 20),  # address space
        int(timeout) + 2,  # CPU seconds
        int(job.get("file_bytes", 64 << 20)),  # file size
    )
    code, program = job.get("code", ""), bool(job.get("program", False))
    workspace_bytes = int(job.get("workspace_bytes", 0))
    workspace_problem = restore_workspace(job["files"], workspace_bytes) if job.get("files") else None
    cap = int(job.get("output_bytes", 65536))
    tail = int(job.get("tail_bytes", 4000))
    out, err, rep = Capture(tail), Capture(tail), Capture(MAX_REPORT_BYTES)
    _reset_shared_fds(host)
    start = time.monotonic()
    supervisor = Supervisor(host, start + timeout, cap, out, err, rep)
    key, events = None, []
    if job.get("trust") == "in_process":
        key = os.urandom(8).hex()
        report_fd = 10 + os.urandom(1)[0] % (HIGH_FD - 10)  # below the child's scratch range
        _write_part(host.job_fd, (code, setup, tests, key, report_fd, limits, program))
        os.write(host.cmd_w, b"i")
    else:
        names = [str(n) for n in job.get("names", [])]
        _write_part(host.job_fd, (code, setup, names, program, cap, limits))
        os.write(host.cmd_w, b"j")
        judge(host, supervisor, setup, tests, names, str(job.get("entry_point", "")), events)
    result, survivors, zygote_problem = supervisor.finish()
    violations = []
    if survivors and not result["timed_out"] and not result["output_limit"]:
        # something outlived the job's main process (a daemonised child, a fork bomb)
        violations.append(f"stray_processes:{survivors}")
    if zygote_problem:
        violations.append(zygote_problem)
        host.drop_zygote()  # cleanup() below kills it with everything else
    collected = []

    def collect():
        collected.extend(collect_workspace(workspace_bytes))

    problems = cleanup(host, keep=host.zygote, collect=collect if job.get("collect_files") else None)
    # Every writer is gone now (the zygote writes only pids and statuses): empty the pipes.
    os.set_blocking(host.req_r, False)  # the candidate's end: blocking again before the next job
    pipes = ((host.out_r, out), (host.err_r, err), (host.rep_r, rep), (host.pid_r, Capture(0)),
             (host.req_r, Capture(0)), (host.resp_r, Capture(0)))
    for fd, capture in pipes:
        if not _drain(fd, capture):
            problems.append("cleanup_failed:pipes")
    result["duration_s"] = time.monotonic() - start
    result["stdout_tail"], result["stderr_tail"] = out.text(), err.text()
    result["output_bytes"] = out.total + err.total
    result["events"] = _events(rep, key) if key is not None else events
    oom_kills = host.read_oom_kills()
    result["oom_killed"] = oom_kills > host.oom_kills
    host.oom_kills = oom_kills
    result["violations"] = violations + problems
    result["clean"] = not problems and not zygote_problem
    if job.get("collect_files") and collected:
        result["files"], result["workspace_truncated"] = collected
    if workspace_problem:
        result["workspace_problem"] = workspace_problem
    result["id"] = job.get("id")
    return result


def judge(host, supervisor, setup, tests, names, entry_point, events):
    """Be the judge: run the task's setup and tests here, against the candidate's answers.

    The runner never runs completion code, cannot be signalled from inside the container and is
    non-dumpable, so nothing the candidate does reaches the verdicts but the plain data it
    sends. While it waits for an answer it keeps supervising (deadline, output cap, the zygote).
    What the task's code prints goes to the job's output; it reads an empty stdin. Then the
    candidate is ended: its exit status means nothing once every test has an answer."""
    link = CandidateLink(host, supervisor)
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = _EMPTY_STDIN, _Sink(supervisor.out), _Sink(supervisor.err)
    try:
        judge_main(setup, tests, names, entry_point, Channel(link), _recorder(events))
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    supervisor.end_candidate()


def _recorder(events):
    def report(event):
        if len(events) < 4 * MAX_TESTS:
            events.append(event)
    return report


class _Sink:
    """sys.stdout/sys.stderr while the task's code runs in the runner: into the job's output."""

    def __init__(self, capture):
        self.capture = capture

    def write(self, text):
        self.capture.add(str(text).encode("utf-8", "replace"))
        return len(text)

    def flush(self):
        pass


class _EmptyStdin:
    def read(self, *args):
        return ""

    def readline(self, *args):
        return ""


_EMPTY_STDIN = _EmptyStdin()


class CandidateLink:
    """The judge's end of the pipes to the candidate (see judge.Channel): framed messages over
    non-blocking pipes, pumped by the supervisor while waiting, so that a silent, flooding or
    dead candidate ends the wait (LinkDown) instead of hanging the runner."""

    def __init__(self, host, supervisor):
        self.host = host
        self.supervisor = supervisor
        self.buffer = bytearray()

    def send(self, payload):
        view = memoryview(frame(payload))
        while view:
            if self.supervisor.candidate_exited:
                raise LinkDown("the candidate exited or died")
            try:
                view = view[os.write(self.host.req_w, view):]
            except BlockingIOError:
                self.supervisor.wait(write=self.host.req_w)

    def receive(self):
        buffer = self.buffer
        while True:
            if len(buffer) >= 4:
                size = int.from_bytes(buffer[:4], "big")
                if size > MAX_MESSAGE_BYTES:
                    raise ProtocolError(f"a message of {size} bytes (at most {MAX_MESSAGE_BYTES})")
                if len(buffer) >= 4 + size:
                    message = bytes(buffer[4:4 + size])
                    del buffer[:4 + size]
                    return message
            try:
                chunk = os.read(self.host.resp_r, 1 << 16)
            except BlockingIOError:
                chunk = b""
            if chunk:
                buffer += chunk
            elif self.supervisor.candidate_exited:  # and nothing more in the pipe
                raise LinkDown("the candidate exited or died")
            else:
                self.supervisor.wait(read=self.host.resp_r)


class Supervisor:
    """Watches one job: pumps its output, enforces the deadline and the output cap, and waits for
    the zygote's report. ``wait`` (while the judge waits for the candidate) raises LinkDown once
    the job is over; ``finish`` waits for the end."""

    def __init__(self, host, deadline, cap, out, err, rep):
        self.host, self.deadline, self.cap = host, deadline, cap
        self.out, self.err, self.rep = out, err, rep
        self.result = {"exit_code": None, "signal": None, "timed_out": False, "output_limit": False}
        self.status = b""
        self.candidate_exited = False
        self.survivors = 0
        self.problem = None  # the zygote died or stopped answering
        self.killed_at = None
        self.ended = False  # the runner ended the candidate after the judge was done
        self.awaiting_pid = False
        self.streams = {host.out_r: out, host.err_r: err}

    def wait(self, read=None, write=None):
        """Pump until ``read`` is readable or ``write`` writable, or the candidate exited;
        LinkDown when the job is over."""
        while True:
            if self.problem or self.killed_at is not None:
                reason = self.problem or ("the deadline passed" if self.result["timed_out"] else "the output cap was hit")
                raise LinkDown(reason, over=True)
            if self.candidate_exited:
                return
            if self.pump(read, write):
                return

    def finish(self):
        """Pump until the zygote reports the job's end; (result, survivors, zygote problem)."""
        while not self.candidate_exited and self.problem is None:
            self.pump()
        return self.result, self.survivors, self.problem

    def end_candidate(self):
        """The judge is done: end the candidate (it serves until it is told otherwise)."""
        if not self.candidate_exited and self.problem is None and self.killed_at is None:
            self.ended = True
            self.kill()

    def kill(self):
        self.killed_at = time.monotonic()
        # its process group at once (a fork bomb starves the zygote of CPU); the pid waits in
        # its pipe, or is about to arrive if the zygote has not forked yet
        self.awaiting_pid = not _kill_job(self.host)
        if self.awaiting_pid:
            self.host.poller.register(self.host.pid_r, select.POLLIN)

    def pump(self, read=None, write=None):
        """One round of polling; True when ``read``/``write`` is ready. Reports are not watched
        (each would wake the runner): they are emptied every ``REPORT_DRAIN_S`` and after."""
        host, result = self.host, self.result
        now = time.monotonic()
        if self.killed_at is None:
            if now >= self.deadline:
                result["timed_out"] = True
            if result["timed_out"] or result["output_limit"]:
                self.kill()
        elif now - self.killed_at > ZYGOTE_GRACE_S:
            self.problem = "runner_zygote_unresponsive"
            return False
        until = self.deadline if self.killed_at is None else self.killed_at + ZYGOTE_GRACE_S
        wait = max(min(until - now, REPORT_DRAIN_S), 0.001)
        poller = host.poller
        for fd, mask in ((read, select.POLLIN), (write, select.POLLOUT)):
            if fd is not None:
                poller.register(fd, mask)
        ready = False
        try:
            for fd, _ in poller.poll(wait * 1000):
                if fd == read or fd == write:
                    ready = True
                elif fd == host.zygote_fd:
                    self.problem = "runner_zygote_died"
                elif fd == host.status_r:
                    self._status()
                elif fd == host.pid_r:
                    if _kill_job(host):
                        poller.unregister(fd)
                        self.awaiting_pid = False
                elif not _read_some(fd, self.streams[fd]):  # the runner holds the write ends
                    raise RuntimeError("an output pipe of the job was closed")
        finally:
            for fd in (read, write):
                if fd is not None:
                    poller.unregister(fd)
            if (self.candidate_exited or self.problem) and self.awaiting_pid:
                poller.unregister(host.pid_r)
                self.awaiting_pid = False
        _read_some(host.rep_r, self.rep)
        if self.killed_at is None and (
            self.out.total + self.err.total > self.cap or self.rep.total > MAX_REPORT_BYTES
        ):
            result["output_limit"] = True
        return ready

    def _status(self):
        try:
            self.status += os.read(self.host.status_r, 256)
        except BlockingIOError:
            return
        if self.status.endswith(b"\n"):
            code, self.survivors = (int(x) for x in self.status.split())
            self.candidate_exited = True
            if not self.ended:  # its own end, not the runner's after the verdicts
                if os.WIFSIGNALED(code):
                    self.result["signal"] = os.WTERMSIG(code)
                else:
                    self.result["exit_code"] = os.WEXITSTATUS(code)


def _reset_shared_fds(host):
    """Blocking mode lives on an open file, which the job's processes share with the runner:
    undo whatever the last job set on the descriptors the next one gets, so that no job can
    trip up the next one."""
    for fd in (host.out_w, host.err_w, host.rep_w, host.req_r, host.resp_w):
        os.set_blocking(fd, True)


def load_part(fd):
    """A child's part of the job: the runner's marshal of trusted data (never the candidate's)."""
    return marshal.loads(os.pread(fd, os.fstat(fd).st_size, 0))


def _write_part(fd, part):
    data = marshal.dumps(part)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _kill_job(host):
    """SIGKILL the job (its process group, then itself) if the zygote has said which it is;
    False when it has not yet."""
    try:
        line = os.read(host.pid_r, 64)
    except BlockingIOError:
        return False
    if not line:
        return False
    _kill(int(line.split()[0]))
    return True


def _kill(pid):
    """SIGKILL the job's process group (the job leads its own), then the job."""
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
    """After every writer is dead: read what is left in the pipe (bounded: a pipe holds at
    most 1 MB). False when it is not empty after ``limit`` bytes."""
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
    """The harness's events that carry this job's key (others are forgeries or garbage)."""
    events = []
    for line in bytes(capture.tail).splitlines()[:4000]:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.pop("k", None) == key:
            events.append(event)
    return events


def _pids():
    return [p for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def cleanup(host, keep=None, collect=None):
    """Make sure no process is left but init and the zygote ``keep`` (which normally killed the
    rest already), call ``collect()`` (nothing of the job runs any more), then wipe the writable
    places. Returns the problems found."""
    problems = []
    # Two tasks in the container are the runner and the zygote (alive, or a zombie not yet
    # reaped: only this function reaps): nothing to reap, nothing to kill. The usual case.
    if keep is None or host.tasks() != 2:
        problems += _reap_and_kill(host, keep)
    if collect is not None:
        collect()
    if os.listdir(WORK):
        _wipe(WORK)
        if os.listdir(WORK):
            problems.append("cleanup_failed:work_dir")
    try:
        if os.listdir(MQUEUE):  # creating queues is disabled by sysctl; checked anyway
            _wipe(MQUEUE)
            problems.append("cleanup_failed:mqueue")
    except OSError:
        pass
    return problems


def _reap_and_kill(host, keep):
    """Reap what was reparented to us and wait until no process is left but init and ``keep``;
    if they will not go, kill everything, the zygote too."""
    problems = []
    spare = () if keep is None else (str(keep),)
    for attempt in range(600):
        while True:  # zombies of the job's orphans, reparented to init
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not [p for p in _pids() if p not in spare]:
            break
        if spare and attempt == 200:  # 100 ms and still there: the zygote did not manage
            problems.append("cleanup_failed:processes")
            spare = ()
            host.drop_zygote()
        if not spare:
            try:
                os.kill(-1, signal.SIGKILL)  # everyone but init (us); atomic w.r.t. fork
            except ProcessLookupError:
                pass
        time.sleep(0.0005)
    else:
        problems.append("cleanup_failed:processes")
    return problems


WORKSPACE_FILES = 256  # an episode's workspace: at most this many files ...
WORKSPACE_DEPTH = 8  # ... this deep ...
WORKSPACE_SCAN = 4096  # ... found among this many entries


def restore_workspace(files, budget):
    """Write an episode's files (``[[relative path, base64]]``, collected after its last turn)
    into the empty ``/work`` before the job is forked. Paths are checked: relative, normalised,
    no ``..``, created here (never through a link). Returns the problem, or None."""
    if not isinstance(files, list) or len(files) > WORKSPACE_FILES:
        return f"workspace: not a list of at most {WORKSPACE_FILES} files"
    for item in files:
        try:
            path, encoded = item
            data = binascii.a2b_base64(encoded)
        except (TypeError, ValueError, binascii.Error):
            return "workspace: bad entry"
        parts = path.split("/") if isinstance(path, str) else []
        if (not parts or len(parts) > WORKSPACE_DEPTH or "\0" in path
                or any(p in ("", ".", "..") or len(p) > 255 for p in parts)):
            return "workspace: bad path"
        budget -= len(data)
        if budget < 0:
            return "workspace: over its size"
        try:
            directory = WORK
            for part in parts[:-1]:
                directory = os.path.join(directory, part)
                try:
                    os.mkdir(directory, 0o700)
                except FileExistsError:
                    if os.path.islink(directory) or not os.path.isdir(directory):
                        return "workspace: bad path"
            fd = os.open(os.path.join(WORK, *parts), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except OSError as exc:
            return f"workspace: {type(exc).__name__}"
    return None


def collect_workspace(budget):
    """The regular files the job left in ``/work`` (``[[relative path, base64]]``), for the next
    turn of its episode, and whether any had to be left out (links, devices, FIFOs are never
    followed or read; past ``budget`` bytes or the file counts, files are left out)."""
    found, truncated, seen = [], False, 0
    stack = [("", WORK, 0)]
    while stack:
        relative, directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            seen += 1
            if seen > WORKSPACE_SCAN:
                return found, True
            name = f"{relative}/{entry.name}" if relative else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 < WORKSPACE_DEPTH:
                        stack.append((name, entry.path, depth + 1))
                    else:
                        truncated = True
                    continue
                if not entry.is_file(follow_symlinks=False):
                    truncated = True  # links, FIFOs, sockets: not carried
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                truncated = True
                continue
            try:
                size = os.fstat(fd).st_size
                if len(found) >= WORKSPACE_FILES or size > budget:
                    truncated = True
                    continue
                data = os.read(fd, size + 1)
            except OSError:
                truncated = True
                continue
            finally:
                os.close(fd)
            if len(data) > budget:
                truncated = True
                continue
            budget -= len(data)
            found.append([name, binascii.b2a_base64(data, newline=False).decode()])
    return found, truncated


def _wipe(directory):
    """Remove everything under ``directory`` (iteratively: a deep tree must not overflow the
    runner's stack), first restoring permissions the code may have removed."""
    stack, dirs = [directory], []
    while stack:
        path = stack.pop()
        if path != directory:
            dirs.append(path)
            try:
                os.chmod(path, 0o700, follow_symlinks=False)
            except OSError:
                pass
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            pass
        except OSError:
            pass
    for path in reversed(dirs):
        try:
            os.rmdir(path)
        except OSError:
            pass


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


def _reply(obj):
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def warm_up():
    """Exercise, in the parent, what every child will use, so that lazily built state (parser
    tables, codecs, interned names) is made once and shared copy-on-write instead of being
    rebuilt in each child; then freeze the heap so no child's GC walks (and copies) it. Only
    made-up data passes through here: the zygote, forked next, must hold nothing of any job."""
    namespace = {"__name__": "warmup"}
    exec(compile("def f(x):\n    return [x, {'a': 1}, 'x' * 2]\n", "<warmup>", "exec"), namespace)
    exec(compile("assert f(1)[0] == 1", "<warmup test>", "exec"), namespace)
    json.loads(_event_line({"e": "test", "i": 0, "ok": False, "line": None, "msg": "\u00e9"}, "0"))
    try:
        exec(compile("def g():\n    1 / 0\ng()", "<warmup>", "exec"), namespace)
    except ZeroDivisionError as exc:
        stderr, sys.stderr = sys.stderr, open(os.devnull, "w")
        try:
            print_exception(exc)
        finally:
            sys.stderr.close()
            sys.stderr = stderr
    _warm_protocol(namespace["f"])
    gc.collect()
    gc.freeze()


def _warm_protocol(function):
    """One call through the judge/candidate protocol, both ends in this process (the messages
    are small enough to wait in the pipes)."""
    fds = os.pipe() + os.pipe() + os.pipe()
    req_r, req_w, resp_r, resp_w, sink_r, sink_w = fds
    try:
        handles = Handles("warmup")
        hid = handles.of(function)
        value = [1, 2.5, "s", (1,), {1: {2}}, frozenset(), b"x", bytearray(b"y"), None, True]
        send_text(req_w, Encoder(_proxy_id).text(["call", 1, hid, [value], []]))
        os.close(req_w)
        _serve(None, handles, Encoder(handles.of), req_r, resp_w, 1000)  # answers, then sees EOF
        Channel(PipeLink(sink_w, resp_r)).value(["call", hid, [value], []])  # reads that answer
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def main():
    # Python installs a SIGINT handler; with one installed, code in the container could
    # deliver SIGINT to PID 1. Default dispositions make init immune to in-namespace signals.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    import builtins

    builtins.exit = builtins.quit = sys.exit  # what `site` would add (the runner runs with -S)
    host = Host()
    host.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.environ.clear()  # children inherit exactly this environment
    os.environ.update(CHILD_ENV)
    os.chdir(WORK)
    os.umask(0o077)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # inherited by every job (the container's too)
    problems = cleanup(host)
    if host.tasks() != 1:  # not alone after cleanup (threads?): never trust the count
        host.tasks_fd = None
    warm_up()
    start_zygote(host)
    _reply(
        {
            "ready": True,
            "python": sys.version.split()[0],
            "clean": not problems,
            "sysv_ipc_objects": sysv_ipc_objects(),
            "tasks_counted": host.tasks_fd is not None,  # the cheap "nothing is left" proof works
        }
    )
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
        try:
            _reply(run_job(host, job))
        except Exception as exc:  # a runner bug must not leave the host waiting
            _reply({"id": job.get("id"), "error": f"runner: {type(exc).__name__}: {exc}", "clean": False})


if __name__ == "__main__":
    main()
