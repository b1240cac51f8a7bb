"""One job as PID 1 runs it: :func:`run_job` over a :class:`JobRun`, in phases (refuse when unfit,
prepare, workspace and egress, warm the pytest zygote, start, supervise, clean up, drain the
pipes, collect, report), and the task's own code compiled once per runner (:func:`compile_trusted`,
its asserts explained: :func:`explained_asserts`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module).
"""

import ast
import os
import socket
import time

from rollstream.consumers.executor.runtime.cleanup import SETTLE_S, cleanup
from rollstream.consumers.executor.runtime.host import lose_zygotes, reset_shared_fds, zygotes_halted
from rollstream.consumers.executor.runtime.programs import ADDRESS_SPACE_MB, PYTHON
from rollstream.consumers.executor.runtime.watch import (
    MAX_REPORT_BYTES,
    Capture,
    Supervisor,
    drain,
    read_events,
)
from rollstream.consumers.executor.runtime.workspace import collect_workspace, restore_workspace
from rollstream.consumers.executor.runtime.zygotes import await_zygotes, write_part

PYTEST_WARM_S = 60.0  # the most a first pytest file waits for the pytest zygote to be warm (gVisor: seconds)
JUDGE_PID_DELAY_S = 0.5  # tests only: the runner hook judge_slow_to_say_pid (runtime/supervisor.py RUNNER_HOOKS)


# A failing ``assert left <op> right`` of the tests says what both sides were, as pytest's
# assertion rewriting does: the test's code is compiled as ``assert (l := left) <op> (r := right),
# EXPLAIN(l, "<op>", r)``: the same evaluations in the same order, and a message built by the
# judge from plain data only (runtime/judge.py ``explain``), never by the completion's code.
EXPLAIN = "__assert_explain__"
_OPS = {"Eq": "==", "NotEq": "!=", "Lt": "<", "LtE": "<=", "Gt": ">", "GtE": ">=", "Is": "is", "IsNot": "is not",
        "In": "in", "NotIn": "not in"}


def explained_asserts(tree):
    """``tree`` with every one-comparison ``assert`` that has no message of its own explained."""

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


def run_job(host, job):
    """Hand one job to the zygotes, supervise it, clean up; returns the reply dict.

    A container whose zygotes are gone cannot run a job (a zygote must never hold one, and the
    runner's heap has held jobs), nor one whose zygote did not fork its child ahead after the last
    job (runtime/host.py ``unfit_reason``: it no longer answers, whatever the last job did to it): the reply then says
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
        # A program in another language is built first (runtime/programs.py), within a bound of its own
        # on top of the job's, in an address space its compiler and runtime fit (the JVM's, Go's).
        self.language = str(job.get("language") or PYTHON)
        compile_s = float(job.get("compile_timeout_s", 0.0)) if self.language != PYTHON else 0.0
        memory = int(job.get("memory_mb", 256))
        self.timeout = float(job.get("timeout_s", 5.0)) + compile_s
        self.limits = (
            host.vsz() + (max(memory, ADDRESS_SPACE_MB if self.language != PYTHON else 0) << 20),  # address space
            int(self.timeout) + 2,  # CPU seconds
            int(job.get("file_bytes", 64 << 20)),  # file size
        )
        self.code = job.get("code", "")
        # the candidate's reading of it: a Python program or not, or [language, compile bound]
        self.program = [self.language, compile_s] if self.language != PYTHON else bool(job.get("program", False))
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
    if run.job.get("trust") == "in_process" and run.language == PYTHON:  # a build is always judged
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
    run.halted = zygotes_halted(host)  # stopped or ended by the job, though the job did not need them
    if run.halted and not run.zygote_lost:
        run.violations.append(run.halted)
    reset_shared_fds(host)  # nothing of the job is left to set them again: before PID 1 reads its pipes


def _drain_pipes(host, run):
    """Every writer is gone now (the zygotes write only pids and statuses): empty the pipes."""
    pipes = ((host.out_r, run.out), (host.err_r, run.err), (host.jout_r, run.out), (host.jerr_r, run.err),
             (host.rep_r, run.rep), (host.pid_r, Capture(0)))
    for fd, capture in pipes:
        if not drain(fd, capture):
            run.problems.append("cleanup_failed:pipes")


def _collect(host, run):
    """The job's output, its events (a judge's only if it finished by itself), its OOM kills."""
    result = run.result
    result["duration_s"] = time.monotonic() - run.start
    result["stdout_tail"], result["stderr_tail"] = run.out.text(), run.err.text()
    result["output_bytes"] = run.out.total + run.err.total
    if run.key is not None:
        result["events"] = read_events(run.rep, run.key)
    else:
        events = read_events(run.rep, None)
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
        lose_zygotes(host)
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
