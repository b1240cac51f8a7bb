"""The in-container runner: PID 1 of every sandbox container. It supervises; it runs no test.

Its ``main`` is the entry point of the runtime's bundle (``python3 -I -S``, the bundle on stdin:
runtime/importer.py); standard library only, it imports the runtime's own modules and nothing
else of rollstream. This module is PID 1's start and its loop over the host's requests; what it
prepares once is runtime/host.py's (:class:`Host`), one job as it runs it runtime/jobrun.py's
(``run_job`` in phases), and the watch over a job's processes and pipes runtime/watch.py's
(``Supervisor``).

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
process-wide hooks, runtime/hooks.py ``install_guards``, that consult each job's guards,
runtime/guards.py), the candidate zygote, and the pytest zygote (a judge
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

import builtins
import ctypes
import json
import os
import resource
import signal
import sys

from rollstream.consumers.executor.runtime.cleanup import cleanup, install_seccomp, sysv_ipc_objects
from rollstream.consumers.executor.runtime.host import Host, lose_zygotes, unfit_reason
from rollstream.consumers.executor.runtime.jobrun import run_job
from rollstream.consumers.executor.runtime.relay import RELAY_PORT, start_relay
from rollstream.consumers.executor.runtime.warmup import warm_up
from rollstream.consumers.executor.runtime.workspace import WORK
from rollstream.consumers.executor.runtime.zygotes import (
    PR_SET_DUMPABLE,
    ZYGOTES,
    drop_to,
    prefork,
    start_zygotes,
)

CHILD_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORK,
    "TMPDIR": WORK,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}


# Tests only (a runner started with --test-hooks): ways to make the machinery fail on purpose.
# lose_zygotes: the zygotes are lost at the end of the job (as when cleanup must kill them);
# lose_zygotes_idle: ... after its reply, while the container waits; exit_before_reply: PID 1
# exits with the job done but unanswered; raise: PID 1 fails handling the job; judge_slow_to_say_pid:
# the judge waits JUDGE_PID_DELAY_S (runtime/jobrun.py) between taking the job and saying its pid (a
# candidate that kills it then: the runner must not wait for a pid that never comes); stop_zygote_idle:
# the candidate zygote is stopped after the reply, before it forks the next child ahead (a zygote that
# no longer answers, whatever stopped it: the next job must be refused, never charged with it).
RUNNER_HOOKS = ("lose_zygotes", "lose_zygotes_idle", "exit_before_reply", "raise", "judge_slow_to_say_pid",
                "stop_zygote_idle")


def _stop_zygote(host, role):
    """Tests only: stop the zygote of ``role`` (start_zygotes forks them in ZYGOTES' order)."""
    os.kill(list(host.zygotes)[ZYGOTES.index(role)], signal.SIGSTOP)


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
                host.unfit = unfit_reason(host)  # said in the next job's refusal: no message more per job
            if hook == "lose_zygotes_idle":
                lose_zygotes(host)
        except Exception as exc:  # a runner bug must not leave the host waiting
            _reply({"id": job.get("id"), "nonce": job.get("nonce"), "error": f"runner: {type(exc).__name__}: {exc}",
                    "clean": False})
