"""PID 1 watching one job (:class:`Supervisor`): it pumps the job's output pipes into their
:class:`Capture`, enforces the deadline and the output cap, ends the candidate once the judge has
exited and reads the zygotes' pids and statuses; and the pipes after the job (:func:`drain`,
:func:`read_events`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module).
"""

import json
import os
import signal
import time

from rollstream.consumers.executor.runtime.zygotes import MAX_TESTS, ZYGOTE_GRACE_S, pytest_warm

MAX_REPORT_BYTES = 1 << 20
REPORT_DRAIN_S = 0.02  # how often the report pipe is emptied while a job runs (it wakes nobody)
CANDIDATE_STATUS_S = 0.5  # a candidate that died on its own before its judge ended: its status is awaited this long
# A child forked ahead that ended during a job without saying its pid (killed by the job's candidate,
# the one process of its uid, between taking the job's command and reporting): if its zygote says no
# new pid by then, the child had taken the job and its end is the job's process's end
AHEAD_TAKEN_S = 0.5


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


def drain(fd, capture, limit=2 << 20):
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


def read_events(capture, key):
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
