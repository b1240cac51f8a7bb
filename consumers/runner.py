"""The in-container runner: PID 1 of every sandbox container, a fresh forked process per job.

This file is executed INSIDE the sandbox (``python3 -I -S -c <this source>``); it uses only the
standard library and must not import rollstream. The executor reads its source and passes it on
the container's command line, so the image does not need rebuilding when it changes.

Protocol (over the container's attach stream, one JSON object per line):

* runner -> host, once at start: ``{"ready": true, "python": "3.11.2", "clean", "sysv_ipc_objects",
  "tasks_counted"}``
* host -> runner: a job ``{"id", "setup", "code", "tests", "timeout_s", "memory_mb",
  "output_bytes", "tail_bytes"}``
* runner -> host: ``{"id", "exit_code", "signal", "duration_s", "timed_out", "output_limit",
  "oom_killed", "output_bytes", "stdout_tail", "stderr_tail", "events", "violations", "clean"}``

Processes: the runner (PID 1) forks, once, a *zygote*, and per job the zygote forks a child.
The runner never forks jobs itself: a fork shares every page and whichever side writes one first
copies it, so a runner doing its per-job work (JSON, pipes, cleanup) next to a fresh fork would
copy hundreds of pages per job; the zygote only forks, waits and kills, and copies almost none.

Per job the runner writes the job (marshal, with the task's setup and tests compiled once and
cached) to an in-memory file and tells the zygote "go". The zygote loads it and forks; the child
leads a new process group, gets /dev/null as stdin, pipes to the runner as stdout and stderr
and, on a random descriptor, as the report channel; closes every other fd; sets rlimits
(address space, CPU, file size); and runs, in the fixed environment and the tmpfs ``/work``,
``setup``, then the completion's ``code`` (compiled as ``<completion>``), then each test,
reporting one event per step, each carrying a per-job key.

When the child exits the zygote reaps it and makes sure nothing else is left: when the
container's pids cgroup counts exactly two tasks (the runner and the zygote) there is nothing
to kill; otherwise it SIGKILLs every other process (``kill(-1)``, which spares init and the
caller, and cannot race with fork) until none is left, and reports the exit status and how many
processes had outlived the child. At the deadline or over the output cap the runner SIGKILLs
the child's process group itself first. The runner then checks on its own that nothing but the
zygote is left (the same cgroup count, else it reaps the orphans, scans ``/proc`` and if need be
kills everything, zygote included, itself), wipes ``/work`` (restoring permissions the code
removed) and replies; ``clean: false`` tells the host to recycle the container. If the zygote
dies or stops answering (only the code can do that), the runner kills everything and reports a
``runner_zygote_*`` violation. SysV IPC and POSIX message queues need no cleaning: the
container's sysctls make creating them impossible; there is no /dev/shm.

Wake-ups are kept to two per job (the request, the zygote's final status): the job's pid and
its test reports wait in their pipes until the runner needs them (the pid only to kill; the
reports are drained after the job, and every ``REPORT_DRAIN_S`` while it runs). Only stdout
and stderr are watched as they are written, so that the output cap acts at once.

Why PID 1: the kernel drops signals sent to a namespace's init from inside the namespace unless
init installed a handler, so the code cannot kill the runner (we install none, and reset
SIGINT). The runner and the zygote are non-dumpable, so same-uid code cannot ptrace them or open
``/proc/<pid>/{mem,environ,fd}`` to forge replies.
"""

import ctypes
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
ZYGOTE_GRACE_S = 2.0  # how long the zygote may take to report after its job was killed
REPORT_DRAIN_S = 0.02  # how often a running job's report pipe is emptied (it wakes nobody)
PR_SET_DUMPABLE = 4
# The container's pids cgroup counter (v1, v2): every task in the container, zombies included.
TASK_COUNTERS = ("/sys/fs/cgroup/pids/pids.current", "/sys/fs/cgroup/pids.current")
# OOM kills in the container's memory cgroup (v2, or v1 on kernels >= 4.13).
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def harness(code, setup, tests, report):
    """Run setup, code and tests in this process; ``report(dict)`` writes one event.

    ``setup`` and ``tests`` are the task's sources compiled by the runner before the fork (a code
    object, or the compile error as text; ``setup`` None when there is none); only the
    completion's ``code`` is compiled here.
    """
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
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
        _print_exception(exc)
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
    try:
        exec(code, namespace)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: tests never ran
        _print_exception(exc)
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


def _text(exc, limit):
    try:
        return str(exc)[:limit]
    except BaseException:  # a hostile __str__
        return "<unprintable>"


def _line_of(exc):
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<completion>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _print_exception(exc):
    """Print like the interpreter would (no source lines: the code is not a file), skipping the
    runner's own frames. By hand: the traceback module pulls a dozen modules into the runner,
    which every fork then copies."""
    try:
        if isinstance(exc, SyntaxError):
            lines = [f'  File "{exc.filename}", line {exc.lineno}\n']
            if exc.text:
                lines.append(f"    {exc.text.strip()}\n")
            lines.append(f"{type(exc).__name__}: {exc.msg}\n")
        else:
            frames, tb = [], exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                if code.co_filename != harness.__code__.co_filename:
                    frames.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}\n')
                tb = tb.tb_next
            if len(frames) > 40:
                frames = frames[:20] + [f"  [... {len(frames) - 40} more frames ...]\n"] + frames[-20:]
            text = _text(exc, 2000)
            lines = [
                "Traceback (most recent call last):\n",
                *frames,
                f"{type(exc).__name__}: {text}\n" if text else f"{type(exc).__name__}\n",
            ]
        sys.stderr.write("".join(lines))
        sys.stderr.flush()
    except BaseException:
        pass


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
        # Channels shared with the zygote and, through it, with every job: the job itself (an
        # in-memory file the runner rewrites per job), the job's stdout/stderr/report pipes (read
        # here), the zygote's commands, the job's pid and the zygote's final status per job.
        self.job_fd = os.memfd_create("job")
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()
        self.cmd_r, self.cmd_w = os.pipe()
        self.pid_r, self.pid_w = os.pipe()
        self.status_r, self.status_w = os.pipe()
        for fd in (self.out_r, self.err_r, self.rep_r, self.pid_r, self.status_r):
            os.set_blocking(fd, False)
        # Registered once; the zygote's pidfd is added and removed as zygotes come and go.
        self.poller = select.poll()
        for fd in (self.out_r, self.err_r, self.status_r):
            self.poller.register(fd, select.POLLIN)
        self.zygote = None
        self.zygote_fd = None

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
    """Fork the zygote: the process every job is forked from.

    Why a zygote: a fork shares every page; whichever side writes a page first copies it. If
    the runner forked jobs itself, its own per-job work (JSON, pipes, cleanup) would copy a few
    hundred pages per job. The zygote does nothing but fork, wait and kill, so it writes (and
    copies) almost nothing, and the runner's pages stay private to the runner.
    """
    for fd in (host.pid_r, host.status_r):  # whatever an earlier zygote left there
        _drain(fd, Capture(0))
    pid = os.fork()
    if pid == 0:
        zygote_main(host)
    host.zygote = pid
    host.zygote_fd = os.pidfd_open(pid)
    host.poller.register(host.zygote_fd, select.POLLIN)


def zygote_main(host):
    """Per "g" on the command pipe: load the job, fork it, report its pid, wait for it, make
    sure nothing else is left (kill(-1) spares init and the zygote), report. Never returns."""
    try:
        for fd in (0, 1, 2):  # never hold the runner's channel to the host
            os.dup2(host.null, fd)
        for fd in (host.cmd_w, host.pid_r, host.status_r, host.out_r, host.err_r, host.rep_r):
            os.close(fd)
        me = str(os.getpid())
        while os.read(host.cmd_r, 1) == b"g":
            # Loaded here, not in the child: unmarshalling allocates all over the heap, and in
            # the child every page that touches is a copy-on-write fault, paid per job.
            job = marshal.loads(os.pread(host.job_fd, os.fstat(host.job_fd).st_size, 0))
            pid = os.fork()
            if pid == 0:
                child_main(host, job)
            job = None
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


def child_main(host, job):
    """In the forked job: isolate, limit, run the harness, exit. Never returns.

    Everything here runs in a fresh fork, where each page written is first copied: the less
    distinct code and data it touches, the cheaper an execution (see docs/executor.md)."""
    status = 70
    try:
        code, setup, tests, key, report_fd, limits = job
        os.setpgid(0, 0)  # its own process group (a new session would also cost a scheduler group)
        os.dup2(host.null, 0)
        os.dup2(host.out_w, 1)
        os.dup2(host.err_w, 2)
        # The report channel sits on a random descriptor and every event carries a per-job key:
        # code that just writes to fd 3 cannot fake test results (see docs/executor.md).
        os.dup2(host.rep_w, report_fd)
        os.closerange(3, report_fd)
        os.closerange(report_fd + 1, 65536)
        _set_limits(host, limits)
        # sys.stdout/sys.stderr are the runner's, never written by it (it uses os.write), so
        # their buffers are empty; fds 1 and 2 now are this job's pipes. Reusing them saves
        # building new stream objects (and the copy-on-write faults that costs) per job.
        sys.stdin = host.stdin
        sys.argv = ["solution"]

        def report(event, _write=os.write, _encode=_event_line):
            _write(report_fd, _encode(event, key))

        status = harness(code, setup, tests, report)
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        status = 71
    except BaseException as exc:  # the harness itself failed: say why on stderr
        status = 72
        try:
            os.write(2, f"runner child: {type(exc).__name__}: {exc}\n".encode())
        except BaseException:
            pass
    os._exit(status)


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
    """Hand one job to the zygote, supervise it, clean up; returns the reply dict."""
    if host.zygote is None:
        start_zygote(host)
    setup = compile_trusted(host, job["setup"], "<setup>") if job.get("setup") else None
    tests = [compile_trusted(host, t, f"<test {i}>") for i, t in enumerate(job.get("tests", []))]
    key = os.urandom(8).hex()
    report_fd = 10 + os.urandom(1)[0] % 200  # below nofile (256)
    timeout = float(job.get("timeout_s", 5.0))
    limits = (
        host.vsz() + (int(job.get("memory_mb", 256)) << 20),  # address space
        int(timeout) + 2,  # CPU seconds
        int(job.get("file_bytes", 64 << 20)),  # file size
    )
    data = marshal.dumps((job.get("code", ""), setup, tests, key, report_fd, limits))
    os.ftruncate(host.job_fd, 0)
    os.pwrite(host.job_fd, data, 0)
    tail = int(job.get("tail_bytes", 4000))
    out, err, rep = Capture(tail), Capture(tail), Capture(MAX_REPORT_BYTES)
    start = time.monotonic()
    os.write(host.cmd_w, b"g")
    result, survivors, zygote_problem = supervise(
        host, start + timeout, int(job.get("output_bytes", 65536)), out, err, rep
    )
    violations = []
    if survivors and not result["timed_out"] and not result["output_limit"]:
        # something outlived the job's main process (a daemonised child, a fork bomb)
        violations.append(f"stray_processes:{survivors}")
    if zygote_problem:
        violations.append(zygote_problem)
        host.drop_zygote()  # cleanup() below kills it with everything else
    problems = cleanup(host, keep=host.zygote)
    # Every writer is gone now (the zygote only writes pid and status): empty the pipes.
    pipes = ((host.out_r, out), (host.err_r, err), (host.rep_r, rep), (host.pid_r, Capture(0)))
    for fd, capture in pipes:
        if not _drain(fd, capture):
            problems.append("cleanup_failed:pipes")
    result["duration_s"] = time.monotonic() - start
    result["stdout_tail"], result["stderr_tail"] = out.text(), err.text()
    result["output_bytes"] = out.total + err.total
    result["events"] = _events(rep, key)
    oom_kills = host.read_oom_kills()
    result["oom_killed"] = oom_kills > host.oom_kills
    host.oom_kills = oom_kills
    result["violations"] = violations + problems
    result["clean"] = not problems and not zygote_problem
    result["id"] = job.get("id")
    return result


def supervise(host, deadline, cap, out, err, rep):
    """Pump the job's output and the zygote's status until the job is over.

    Returns (result, survivors, zygote problem or None). At the deadline or over the output
    cap the job is SIGKILLed (the zygote then kills the rest); a zygote that dies or stops
    answering is a violation, and the runner kills everything itself. Reports are not watched
    (each would wake the runner): they are emptied every ``REPORT_DRAIN_S`` and after the job.
    """
    poller = host.poller
    streams = {host.out_r: out, host.err_r: err}
    result = {"exit_code": None, "signal": None, "timed_out": False, "output_limit": False}
    status, killed_at, awaiting_pid = b"", None, False
    try:
        while True:
            now = time.monotonic()
            if killed_at is None and now >= deadline:
                result["timed_out"] = True
            if killed_at is None and (result["timed_out"] or result["output_limit"]):
                killed_at = now
                # its process group at once (a fork bomb starves the zygote of CPU); the pid
                # waits in its pipe, or is about to arrive if the zygote has not forked yet
                awaiting_pid = not _kill_job(host)
                if awaiting_pid:
                    poller.register(host.pid_r, select.POLLIN)
            if killed_at is not None and now - killed_at > ZYGOTE_GRACE_S:
                return result, 0, "runner_zygote_unresponsive"
            until = deadline if killed_at is None else killed_at + ZYGOTE_GRACE_S
            wait = min(until - now, REPORT_DRAIN_S)
            for fd, _ in poller.poll(max(wait, 0.001) * 1000):
                if fd == host.zygote_fd:
                    return result, 0, "runner_zygote_died"
                if fd == host.status_r:
                    try:
                        status += os.read(fd, 256)
                    except BlockingIOError:
                        continue
                    if status.endswith(b"\n"):
                        code, survivors = (int(x) for x in status.split())
                        if os.WIFSIGNALED(code):
                            result["signal"] = os.WTERMSIG(code)
                        else:
                            result["exit_code"] = os.WEXITSTATUS(code)
                        return result, survivors, None
                elif fd == host.pid_r:
                    if _kill_job(host):
                        poller.unregister(fd)
                        awaiting_pid = False
                elif not _read_some(fd, streams[fd]):  # the runner holds the write ends
                    raise RuntimeError("an output pipe of the job was closed")
            _read_some(host.rep_r, rep)
            if killed_at is None and (out.total + err.total > cap or rep.total > MAX_REPORT_BYTES):
                result["output_limit"] = True
    finally:
        if awaiting_pid:
            poller.unregister(host.pid_r)


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


def cleanup(host, keep=None):
    """Make sure no process is left but init and the zygote ``keep`` (which normally killed the
    rest already), then wipe the writable places. Returns the problems found."""
    problems = []
    # Two tasks in the container are the runner and the zygote (alive, or a zombie not yet
    # reaped: only this function reaps): nothing to reap, nothing to kill. The usual case.
    if keep is None or host.tasks() != 2:
        problems += _reap_and_kill(host, keep)
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
    rebuilt in each child; then freeze the heap so no child's GC walks (and copies) it."""
    namespace = {"__name__": "warmup"}
    exec(compile("def f(x):\n    return [x, {'a': 1}, 'x' * 2]\n", "<warmup>", "exec"), namespace)
    exec(compile("assert f(1)[0] == 1", "<warmup test>", "exec"), namespace)
    json.loads(_event_line({"e": "test", "i": 0, "ok": False, "line": None, "msg": "\u00e9"}, "0"))
    try:
        exec(compile("def g():\n    1 / 0\ng()", "<warmup>", "exec"), namespace)
    except ZeroDivisionError as exc:
        stderr, sys.stderr = sys.stderr, open(os.devnull, "w")
        try:
            _print_exception(exc)
        finally:
            sys.stderr.close()
            sys.stderr = stderr
    gc.collect()
    gc.freeze()


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
