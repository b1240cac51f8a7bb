"""The in-container runner: PID 1 of every sandbox container, a fresh forked process per job.

This file is executed INSIDE the sandbox (``python3 -I -S -c <this source>``); it uses only the
standard library and must not import rollstream. The executor reads its source and passes it on
the container's command line, so the image does not need rebuilding when it changes.

Protocol (over the container's attach stream, one JSON object per line):

* runner -> host, once at start: ``{"ready": true, "python": "3.11.2"}``
* host -> runner: a job ``{"id", "setup", "code", "tests", "timeout_s", "memory_mb",
  "output_bytes", "tail_bytes"}``
* runner -> host: ``{"id", "exit_code", "signal", "duration_s", "timed_out", "output_limit",
  "oom_killed", "output_bytes", "stdout_tail", "stderr_tail", "events", "violations", "clean"}``

Processes: the runner (PID 1) forks, once, a *zygote*, and per job the zygote forks a child.
The runner never forks jobs itself: a fork shares every page and whichever side writes one first
copies it, so a runner doing its per-job work (JSON, pipes, cleanup) next to a fresh fork would
copy hundreds of pages per job; the zygote only forks, waits and kills, and copies almost none.

Per job the runner writes the job (marshal, with the task's setup and tests compiled once and
cached) to an in-memory file and tells the zygote "go". The child reads it, leads a new
process group, gets /dev/null as stdin, pipes to the runner as stdout and stderr and, on a
random descriptor, as the report channel; closes every other fd; sets rlimits (address space,
CPU, file size, no core); and runs, in the fixed environment and the tmpfs ``/work``,
``setup``, then the completion's ``code`` (compiled as ``<completion>``), then each test,
reporting one event per step, each carrying a per-job key.

When the child exits the zygote SIGKILLs every other process (``kill(-1)``, which spares init
and the caller, and cannot race with fork) and reports the exit status and how many processes
had outlived the child. At the deadline or over the output cap the runner SIGKILLs the child's
process group itself first. The runner then reaps the orphans, checks that nothing but the
zygote is left (else it kills everything, zygote included, itself), wipes ``/work`` (restoring
permissions the code removed) and replies; ``clean: false`` tells the host to recycle the
container. If the zygote dies or stops answering (only the code can do that), the runner
kills everything and reports a ``runner_zygote_*`` violation. SysV IPC and POSIX message queues
need no cleaning: the container's sysctls make creating them impossible; there is no /dev/shm.

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
PR_SET_DUMPABLE = 4


def harness(job, report):
    """Run setup, code and tests in this process; ``report(dict)`` writes one event.

    ``job["_setup"]`` and ``job["_tests"]`` are the task's sources compiled by the runner before
    the fork (a code object, or the compile error as text); only the completion is compiled here.
    """
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    setup = job.get("_setup")
    if setup is not None:
        try:
            if isinstance(setup, str):
                raise SyntaxError(setup)
            exec(setup, namespace)
        except BaseException as exc:  # the task's own setup is broken
            report({"e": "setup_error", "type": type(exc).__name__, "msg": str(exc)[:500]})
            return 1
    try:
        code = compile(job["code"], "<completion>", "exec")
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
    for index, test in enumerate(job.get("_tests", [])):
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
        self.compiled = {}
        self.jobs = 0
        self._vsz = 0
        self.oom_kills = _oom_kills()
        # Channels shared with the zygote and, through it, with every job: the job itself (an
        # in-memory file the runner rewrites per job), the job's stdout/stderr/report pipes (read
        # here), the zygote's commands and its status messages.
        self.job_fd = os.memfd_create("job")
        self.out_r, self.out_w = os.pipe()
        self.err_r, self.err_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()
        self.cmd_r, self.cmd_w = os.pipe()
        self.status_r, self.status_w = os.pipe()
        for fd in (self.out_r, self.err_r, self.rep_r, self.status_r):
            os.set_blocking(fd, False)
        self.zygote = None
        self.zygote_fd = None

    def vsz(self):
        """The runner's address-space size (refreshed now and then: it barely changes)."""
        if self.jobs % 256 == 0:
            with open("/proc/self/statm") as f:
                self._vsz = int(f.read().split()[0]) * self.page
        self.jobs += 1
        return self._vsz


def start_zygote(host):
    """Fork the zygote: the process every job is forked from.

    Why a zygote: a fork shares every page; whichever side writes a page first copies it. If
    the runner forked jobs itself, its own per-job work (JSON, pipes, cleanup) would copy a few
    hundred pages per job. The zygote does nothing but fork, wait and kill, so it writes (and
    copies) almost nothing, and the runner's pages stay private to the runner.
    """
    pid = os.fork()
    if pid == 0:
        zygote_main(host)
    host.zygote = pid
    host.zygote_fd = os.pidfd_open(pid)


def zygote_main(host):
    """Per "g" on the command pipe: fork a job, report its pid, wait for it, kill everything
    but init and itself (kill(-1) spares both), report. Never returns."""
    try:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):  # never hold the runner's channel to the host
            os.dup2(null, fd)
        for fd in (null, host.cmd_w, host.status_r, host.out_r, host.err_r, host.rep_r):
            os.close(fd)
        me = str(os.getpid())
        while os.read(host.cmd_r, 1) == b"g":
            pid = os.fork()
            if pid == 0:
                child_main(host)
            os.write(host.status_w, b"%d\n" % pid)
            _, status = os.waitpid(pid, 0)
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
    """In the forked job: read the job, isolate, limit, run the harness, exit. Never returns."""
    status = 70
    try:
        size = os.fstat(host.job_fd).st_size
        job = marshal.loads(os.pread(host.job_fd, size, 0))
        os.setpgid(0, 0)  # its own process group (a new session would also cost a scheduler group)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(host.out_w, 1)
        os.dup2(host.err_w, 2)
        # The report channel sits on a random descriptor and every event carries a per-job key:
        # code that just writes to fd 3 cannot fake test results (see docs/executor.md).
        report_fd, key = job["report_fd"], job["key"]
        os.dup2(host.rep_w, report_fd)
        os.closerange(3, report_fd)
        os.closerange(report_fd + 1, 65536)
        _set_limits(host, job)
        # sys.stdout/sys.stderr are the runner's, never written by it (it uses os.write), so
        # their buffers are empty; fds 1 and 2 now are this job's pipes. Reusing them saves
        # building new stream objects (and the copy-on-write faults that costs) per job.
        sys.stdin = host.stdin
        sys.argv = ["solution"]

        def report(event, _write=os.write, _dumps=json.dumps):
            event["k"] = key
            _write(report_fd, (_dumps(event) + "\n").encode())

        status = harness(job, report)
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


def _set_limits(host, job):
    # The runner is non-dumpable and fork inherits that, which would make /proc/self root-owned
    # for the code; the job's own processes may see themselves normally. (The container's
    # OomScoreAdj of 1000 is inherited, so the OOM killer already prefers them.)
    host.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    mem = job["vsz"] + (int(job.get("memory_mb", 256)) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(float(job.get("timeout_s", 5.0))) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = int(job.get("file_bytes", 64 << 20))
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
    key = os.urandom(8).hex()
    payload = {
        "code": job.get("code", ""),
        "_setup": setup,
        "_tests": [compile_trusted(host, t, f"<test {i}>") for i, t in enumerate(job.get("tests", []))],
        "key": key,
        "report_fd": 10 + int.from_bytes(os.urandom(1), "little") % 200,  # below nofile (256)
        "memory_mb": int(job.get("memory_mb", 256)),
        "timeout_s": float(job.get("timeout_s", 5.0)),
        "file_bytes": int(job.get("file_bytes", 64 << 20)),
        "vsz": host.vsz(),
    }
    data = marshal.dumps(payload)
    os.ftruncate(host.job_fd, 0)
    os.pwrite(host.job_fd, data, 0)
    tail = int(job.get("tail_bytes", 4000))
    streams = {host.out_r: Capture(tail), host.err_r: Capture(tail), host.rep_r: Capture(MAX_REPORT_BYTES)}
    for fd in streams:  # nothing should be there; whatever is, is not this job's
        _drain(fd, Capture(0))
    start = time.monotonic()
    os.write(host.cmd_w, b"g")
    result, survivors, zygote_problem = supervise(host, job, streams, start)
    violations = []
    if survivors and not result["timed_out"] and not result["output_limit"]:
        # something outlived the job's main process (a daemonised child, a fork bomb)
        violations.append(f"stray_processes:{survivors}")
    if zygote_problem:
        violations.append(zygote_problem)
        host.zygote = None  # cleanup() below kills it with everything else
        os.close(host.zygote_fd)
    problems = cleanup(host, keep=host.zygote)
    for fd, capture in streams.items():
        _drain(fd, capture)
    result["duration_s"] = time.monotonic() - start
    out, err, rep = streams[host.out_r], streams[host.err_r], streams[host.rep_r]
    result["stdout_tail"], result["stderr_tail"] = out.text(), err.text()
    result["output_bytes"] = out.total + err.total
    result["events"] = _events(rep, key)
    oom_kills = _oom_kills()
    result["oom_killed"] = oom_kills > host.oom_kills
    host.oom_kills = oom_kills
    result["violations"] = violations + problems
    result["clean"] = not problems and not zygote_problem
    result["id"] = job.get("id")
    return result


def supervise(host, job, streams, start):
    """Pump the job's pipes and the zygote's status until the job is over.

    Returns (result, survivors, zygote problem or None). At the deadline or over the output
    cap the job is SIGKILLed (the zygote then kills the rest); a zygote that dies or stops
    answering is a violation, and the runner kills everything itself.
    """
    deadline = start + float(job.get("timeout_s", 5.0))
    cap = int(job.get("output_bytes", 65536))
    poller = select.poll()
    for fd in (*streams, host.status_r, host.zygote_fd):
        poller.register(fd, select.POLLIN)
    result = {"exit_code": None, "signal": None, "timed_out": False, "output_limit": False}
    status, pid, killed_at = b"", None, None
    while True:
        now = time.monotonic()
        if killed_at is None and now >= deadline:
            result["timed_out"] = True
        if killed_at is None and (result["timed_out"] or result["output_limit"]):
            killed_at = now
            if pid is not None:
                _kill(pid)  # its process group at once (a fork bomb starves the zygote of CPU)
        if killed_at is not None and now - killed_at > ZYGOTE_GRACE_S:
            return result, 0, "runner_zygote_unresponsive"
        wait = (deadline if killed_at is None else killed_at + ZYGOTE_GRACE_S) - now
        for fd, _ in poller.poll(max(wait, 0.001) * 1000):
            if fd == host.zygote_fd:
                return result, 0, "runner_zygote_died"
            if fd == host.status_r:
                try:
                    status += os.read(fd, 256)
                except BlockingIOError:
                    continue
                lines = status.split(b"\n")
                if pid is None and len(lines) > 1:
                    pid = int(lines[0])
                    if killed_at is not None:
                        _kill(pid)
                if len(lines) > 2:
                    code, survivors = (int(x) for x in lines[1].split())
                    if os.WIFSIGNALED(code):
                        result["signal"] = os.WTERMSIG(code)
                    else:
                        result["exit_code"] = os.WEXITSTATUS(code)
                    return result, survivors, None
            elif not _read_some(fd, streams[fd]):
                poller.unregister(fd)
        output = streams[host.out_r].total + streams[host.err_r].total
        if killed_at is None and (output > cap or streams[host.rep_r].total > MAX_REPORT_BYTES):
            result["output_limit"] = True


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


def _drain(fd, capture, limit=1 << 20):
    """After everything is dead: read what is left in the pipe (bounded)."""
    read = 0
    while read < limit:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        if not data:
            return
        read += len(data)
        capture.add(data)


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
    """Reap what was reparented to us and make sure no process is left but init and the zygote
    ``keep`` (which normally killed the rest already); if they will not go, kill everything,
    the zygote too. Then wipe the writable places. Returns the problems found."""
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
            host.zygote = None
            os.close(host.zygote_fd)
        if not spare:
            try:
                os.kill(-1, signal.SIGKILL)  # everyone but init (us); atomic w.r.t. fork
            except ProcessLookupError:
                pass
        time.sleep(0.0005)
    else:
        problems.append("cleanup_failed:processes")
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


def _oom_kills():
    """OOM kills in this container's memory cgroup so far (v2, or v1 on kernels >= 4.13)."""
    for path, key in (
        ("/sys/fs/cgroup/memory.events", "oom_kill"),
        ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill"),
    ):
        try:
            with open(path) as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value)
        except OSError:
            continue
    return 0


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
    json.loads(json.dumps({"e": "test", "i": 0, "ok": True, "msg": "\u00e9"}))
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
    problems = cleanup(host)
    warm_up()
    start_zygote(host)
    _reply(
        {
            "ready": True,
            "python": sys.version.split()[0],
            "clean": not problems,
            "sysv_ipc_objects": sysv_ipc_objects(),
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
