"""The zygotes and the job's processes, in the sandbox (a module of the runtime, in its bundle,
runtime/importer.py; standard library only).

PID 1 forks three zygotes once; each forks one child per job, ahead of it when it can: a judge
(consumers/executor/runtime/judge.py), a candidate (consumers/executor/runtime/candidate.py) or,
for ``trust = "in_process"``, one child that runs setup, code and tests together
(consumers/executor/runtime/inprocess.py). The third, the pytest zygote, is a judge zygote with
the image's pytest imported and warm (runtime/pytests.py): the judges of pytest files fork from
it, on demand, so the other judges fork from a zygote without pytest's pages. It imports pytest
when PID 1 first needs it (a container's first pytest file), so a container that never runs one
never holds pytest's pages at all. Each child reads its own part of the job from an
in-memory file PID 1 wrote, enters its limits and descriptors, and exits with a status that says
how it ended."""

import fcntl
import gc
import marshal
import os
import resource
import select
import signal
import socket
import sys
import time
from json.encoder import encode_basestring_ascii as _json_string  # json.dumps' own quoting

from rollstream.consumers.executor.runtime import channel
from rollstream.consumers.executor.runtime.candidate import candidate_main
from rollstream.consumers.executor.runtime.codec import Table
from rollstream.consumers.executor.runtime.decoder import Decoder
from rollstream.consumers.executor.runtime.encoder import Encoder
from rollstream.consumers.executor.runtime.hooks import install_guards
from rollstream.consumers.executor.runtime.inprocess import harness
from rollstream.consumers.executor.runtime.judge import judge_main
from rollstream.consumers.executor.runtime.pytests import run_pytest_files, warm_pytest
from rollstream.consumers.executor.runtime.wire import dumps, loads

MAX_TESTS = 1000  # RewardSpec's own limit on tests per task
ZYGOTES = (b"C", b"J", b"P")  # the candidate zygote, the judge zygote, the pytest files' judge zygote
JUDGES = (b"J", b"P")
ZYGOTE_GRACE_S = 2.0  # how long the zygote may take to report after its job was killed
PR_SET_DUMPABLE = 4
FIRST_HOST_FD = 10  # the runner's descriptors sit at or above this; a job's process uses 0-5
# Separated uids (a runner started as root: the runsc sandbox, see consumers/executor/hardening.py):
# PID 1 and the zygotes stay root and each job's process drops to 65534 before it runs, so the
# code under test can neither signal PID 1 or a zygote nor open their descriptors, whatever the
# kernel does about non-dumpable processes; every channel and job part is made by PID 1 (root,
# 0600), so a judge's are closed to it too. The judge keeps the candidate's uid, as under runc:
# the files either makes in /work (tempfile's 0700 directories included) are the other's.
JOB_IDS = (65534, 65534)  # (uid, gid) of every job's process


def drop_to(host):
    """In a separated runner, this process becomes the jobs' uid and gid for good (root's
    capabilities go with the uid change; no_new_privs keeps them gone)."""
    if host.separated:
        uid, gid = JOB_IDS
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


def move_high(fd):
    """``fd`` moved to a number of at least FIRST_HOST_FD (the original closed)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, FIRST_HOST_FD)
    os.close(fd)
    return moved


def start_zygotes(host):
    """Fork the zygotes (``ZYGOTES``), once per container: the runner's heap holds jobs once it has served
    one and a zygote must never hold any, so a container that lost a zygote is replaced."""
    if host.zygotes_started:
        raise RuntimeError("a zygote is gone; this container must be replaced")
    host.zygotes_started = True
    # Each zygote holds the only write end of a pipe of its own: its exit (or kill) closes it and
    # PID 1's poll sees the read end hang up. A pidfd would say the same, but gVisor has no
    # pidfd_open (ENOSYS), and one mechanism serves both runtimes.
    pipes = {role: tuple(move_high(fd) for fd in os.pipe()) for role in ZYGOTES}
    for role in ZYGOTES:
        pid = os.fork()
        if pid == 0:
            for other, (r, w) in pipes.items():
                os.close(r)
                if other != role:
                    os.close(w)
            host.alive_w = pipes[role][1]
            zygote_main(host, role)
        host.zygotes[pid] = pipes[role][0]
        host.poller.register(pipes[role][0], select.POLLIN)
    for _, w in pipes.values():
        os.close(w)
    prefork(host, (b"C", b"J"))


def prefork(host, roles):
    """Ask these zygotes to fork their next child now, while the container waits for work, and
    wait until they say they did: the runner knows every process the container should hold
    (a child that is not one of them outlived its job)."""
    asked = set()
    for role in roles:
        if role in host.ahead:  # its child forked ahead still waits (the last job's judge was the pytest zygote's)
            continue
        try:
            socket.send_fds(host.command_socket(role), [b"p"], [])
        except OSError:
            continue
        asked.add(role)
    await_zygotes(host, asked)


def await_zygotes(host, asked, pytest=False, wait_s=ZYGOTE_GRACE_S):
    """Read the zygotes' status lines until each role in ``asked`` has said it forked its child
    ahead and, with ``pytest``, the pytest zygote has said it is warm ("P R"), or ``wait_s`` passed."""
    pending, deadline = b"", time.monotonic() + wait_s
    while (asked or (pytest and not host.pytest_ready)) and time.monotonic() < deadline:
        if not select.select([host.status_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        try:
            pending += os.read(host.status_r, 256)
        except BlockingIOError:
            continue
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            fields = line.split()
            if len(fields) == 3 and fields[1] == b"F" and fields[0] in asked:
                host.ahead[fields[0]] = fields[2].decode()
                asked.discard(fields[0])
            else:
                pytest_warm(host, fields)


def pytest_warm(host, fields):
    """Whether a status line says the pytest zygote is warm ("P R"); notes it on ``host``."""
    if fields[:2] != [b"P", b"R"]:
        return False
    host.pytest_ready = True
    return True


def zygote_main(host, role):
    """Forks this zygote's children, one at a time. Commands on its socket: "w" (the pytest
    zygote: import pytest now; any first command does, and "P R" says it is done); "p" forks the
    next child ahead of its job (the runner sends it once the last job is cleaned up, so the fork and
    the child's setup happen while the container waits for work); the child itself then takes
    the job's command ("j": a judge; "c": a candidate; "i": an in-process child) and the job's pipe
    ends from the same socket. A job command that reaches the zygote (no child was waiting) is
    forked for at once. Reports each child's stop at once and its end. Never returns."""
    try:
        for fd in (0, 1, 2):  # never hold the runner's channel to the host
            os.dup2(host.null, fd)
        own = host.commands[role][1]
        for ends in host.commands.values():  # PID 1's ends, and the other zygotes' own
            for sock in ends:
                if sock is not own:
                    sock.close()
        for fd in (host.pid_r, host.status_r, host.out_r, host.err_r, host.jout_r, host.jerr_r, host.rep_r):
            os.close(fd)
        if role in JUDGES:  # judges inherit: every catchable signal ignored, the guards in
            _ignore_signals()
        if role == b"J":
            _guard(host)
        if role == b"C":
            # The candidate's __main__ is the wire it serves the judge over (the runtime's modules
            # are out of sys.modules, runtime/importer.py): code that patches its own process's
            # __main__ patches its own serving code, as when the runtime was one source run as
            # __main__, and the judge still believes only what it decodes.
            sys.modules["__main__"] = channel
        sys.stdin = host.stdin  # what every child has (an empty stdin, its argv): set once, here
        sys.argv = ["solution"]
        host.own = own
        warm = role != b"P"
        while True:
            command, fds, _, _ = socket.recv_fds(own, 1, 2)
            if not warm:  # the pytest zygote's first command: PID 1's "w", before the first pytest file's job
                warm_pytest()  # the image's pytest, warm in every judge of a pytest file (in no candidate)
                _guard(host)
                warm = True
                os.write(host.status_w, b"P R 0\n")  # warm: PID 1 starts a pytest file's clock from here
            if command == b"w":
                continue
            if command != b"p" and command not in JOB_MAINS:
                break
            pid = os.fork()
            if pid == 0:
                _job_process(host, role, command, fds)  # never returns
            for fd in fds:
                os.close(fd)
            if command == b"p":  # the runner counts it as this zygote's until a job takes it
                os.write(host.status_w, b"%s F %d\n" % (role, pid))
            else:  # forked for its job: its pid said here, before its end can be (the job's code may kill it at once)
                os.write(host.pid_w, b"%s %d\n" % (role, pid))
            while True:
                _, status = os.waitpid(pid, os.WUNTRACED)
                if not os.WIFSTOPPED(status):
                    break
                os.write(host.status_w, b"%s S %d\n" % (role, pid))
            os.write(host.status_w, b"%s E %d %d\n" % (role, pid, status))
    except BaseException:
        pass
    os._exit(0)


def _guard(host):
    """A judge zygote, before its first child: the judge's guards in, its heap frozen (a fork
    copies none of it for the collector)."""
    install_guards(out_fds=(host.jout_w, host.jerr_w))
    gc.freeze()


def _job_process(host, role, command, fds):
    """A zygote's child: its own process group; forked ahead of its job ("p"), it waits for the
    job's command on the zygote's socket and reports its pid (a child forked for its job has its
    pid reported by the zygote); it runs the job. Never returns."""
    os.close(host.alive_w)  # the zygote's alone: its pipe hangs up when the zygote ends
    os.setpgid(0, 0)  # its own process group (killed as one)
    drop_to(host)
    if command == b"p":
        _touch()
        command, fds, _, _ = socket.recv_fds(host.own, 1, 2)
        if command not in JOB_MAINS:  # the runner went away
            os._exit(0)
        if host.test_hooks and command == b"j":  # tests only: a judge slow to say its pid
            time.sleep(marshal.loads(os.pread(host.judge_part, os.fstat(host.judge_part).st_size, 0))[3])
        os.write(host.pid_w, b"%s %d\n" % (role, os.getpid()))
    JOB_MAINS[command](host, [move_high(fd) for fd in fds])


def _ignore_signals():
    """Every catchable signal ignored (inherited by each judge). SIGCHLD keeps its default
    (ignored, but children stay waitable)."""
    for number in range(1, signal.NSIG):
        if number in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        try:
            signal.signal(number, signal.SIG_IGN)
        except (OSError, ValueError, RuntimeError):
            continue


def _touch():
    """While waiting for its job: make the pages every job writes first (the codec's, the
    channel's) this process's own now, not on the job's time. Made-up data only."""
    table = Table(0)
    encoder = Encoder(table, None)
    items = [encoder.item([1, "x", (2.5, None)]), encoder.item({"k": b"v"})]
    message = loads(dumps(["q", 1, "call", items, encoder.finish(), encoder.changes(), None, "", "", None]))
    decoder = Decoder(Table(1), 0, None)
    decoder.message(message[4], message[5])
    [decoder.item(item) for item in message[3]]


def candidate_child(host, link):
    """The candidate: the completion and its answers to the judge. Never returns.

    Everything here runs in a fresh fork, where each page written is first copied: the less
    distinct code and data a child touches, the cheaper a job (docs/executor.md, Throughput)."""
    def run():
        code, setup, names, program, out_cap, limits = load_part(host.candidate_part)
        _enter(host, limits, host.out_w, host.err_w, link[0], link[1])
        host.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the completion's own process may see itself
        return candidate_main(code, setup, names, program, 3, 4, out_cap)

    _completion_process(run)


def _completion_process(run):
    """Run a process the completion's code runs in; exit with its status (71: out of memory,
    72: the runtime itself failed, said on stderr). Never returns."""
    status = 70
    try:
        status = run()
        sys.stdout.flush()
        sys.stderr.flush()
    except MemoryError:
        status = 71
    except BaseException as exc:
        status = 72
        _say(exc)
    os._exit(status)


def judge_child(host, link):
    """The judge: this job's setup and tests, against the candidate. Never returns; exits 0 only
    after reporting ``done``. It stays non-dumpable (no ptrace, no /proc/<pid>/{mem,fd} for
    same-uid code), as fork leaves it."""
    status = 73
    try:
        part, limits, hook, _ = load_part(host.judge_part)
        _enter(host, limits, host.jout_w, host.jerr_w, link[0], link[1], host.rep_w)
        report = Reporter(5)
        if hook is not None and host.test_hooks:  # tests only: a judge compromised on purpose
            exec(hook, {"__name__": "hook", "report": report})
        judge_main(part, 3, 4, report, run_files=run_pytest_files)
        report.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        status = 0
    except MemoryError:
        status = 74
    except BaseException as exc:
        _say(exc)
    os._exit(status)


def _enter(host, limits, out, err, *extra):
    """A job's process: /dev/null as stdin, ``out``/``err`` as stdout/stderr, ``extra`` as 3, 4,
    ...; every other descriptor closed (the other processes' pipe ends, the job parts); its
    limits (address space, CPU, file size). The runner's descriptors all sit above 5, so no
    dup2 here overwrites one still to be moved."""
    os.dup2(host.null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for target, source in enumerate(extra, 3):
        os.dup2(source, target)
    os.closerange(3 + len(extra), 65536)
    memory, cpu, fsize = limits
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


class Reporter:
    """The judge's events, as JSON lines on its report pipe (written in batches)."""

    def __init__(self, fd):
        self.fd, self.lines, self.size, self.count = fd, [], 0, 0

    def __call__(self, event):
        if self.count >= 4 * MAX_TESTS:
            return
        self.count += 1
        line = event_line(event)
        self.lines.append(line)
        self.size += len(line)
        if self.size > 32768:
            self.flush()

    def flush(self):
        data = b"".join(self.lines)
        self.lines.clear()
        self.size = 0
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def child_main(host, link):
    """``trust: "in_process"``: setup, code and tests in this one forked process. Never returns."""
    def run():
        code, setup, tests, key, report_fd, limits, program, out_cap, pytest_files = load_part(host.candidate_part)
        # The report channel sits on a random descriptor and every event carries a per-job key:
        # code that just writes to fd 3 cannot fake test results.
        _enter(host, limits, host.out_w, host.err_w, host.rep_w)
        os.dup2(3, report_fd)
        os.close(3)
        host.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)

        def report(event, _write=os.write, _encode=event_line):
            _write(report_fd, _encode(event, key))

        return harness(code, setup, tests, report, program, out_cap, pytest_files)

    _completion_process(run)


JOB_MAINS = {b"j": judge_child, b"c": candidate_child, b"i": child_main}


def _say(exc):
    try:
        os.write(2, f"runner child: {type(exc).__name__}: {exc}\n".encode())
    except BaseException:
        pass


def event_line(event, key=None):
    """One event as a JSON line (with the job's key for an in-process child). By hand rather
    than with json.dumps, which builds a fresh encoder per call: in a forked child that alone
    copied some 60 pages per job."""
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
        elif type(value) is float:  # a test's duration ("d")
            text = float.__repr__(value) if value - value == 0 else "null"  # finite, else null
        elif type(value) is list:
            text = "[" + ",".join(_json_string(v) for v in value if type(v) is str) + "]"
        else:
            text = _json_string(value if type(value) is str else str(value)[:500])
        parts.append(f'"{name}":{text}')
    if key is not None:
        parts.append(f'"k":"{key}"')
    return ("{" + ",".join(parts) + "}\n").encode()


def load_part(fd):
    """A child's part of the job: PID 1's marshal of trusted data (never the candidate's)."""
    data = os.pread(fd, os.fstat(fd).st_size, 0)
    os.close(fd)
    return marshal.loads(data)


def write_part(fd, part):
    data = marshal.dumps(part)
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
