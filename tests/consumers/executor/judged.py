"""A judged job on the host, without Docker: the candidate and the judge as forked processes over
pipes, as the sandbox's zygotes fork them (the candidate's pipes on descriptors 3 and 4). For
unit tests of the judge/candidate protocol; the real sandbox adds the hardening around it."""

from __future__ import annotations

import json
import os
import select
import signal
import time

from rollstream.consumers.executor import jobs
from rollstream.consumers.executor.runtime import candidate, judge


def judged(code: str, tests: list[str], *, setup: str = "", entry_point: str = "", program: bool = False,
           rules: dict | None = None, timeout_s: float = 30.0) -> tuple[list[dict], int]:
    """(the judge's events, its wait status) for ``code`` against ``tests`` under ``rules``
    (crossing.Rules; None: no reference, the strictest reading)."""
    names = list(jobs.tested_names(tuple(tests), entry_point))
    modules = list(jobs.tested_modules(tuple(tests)))
    setup_code = compile(setup, "<setup>", "exec") if setup else None
    compiled = [compile(t, f"<test {i}>", "exec") for i, t in enumerate(tests)]
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    rep_r, rep_w = os.pipe()
    child = os.fork()
    if child == 0:  # the candidate
        status = 70
        try:
            os.setpgid(0, 0)
            for fd in (req_w, resp_r, rep_r, rep_w):
                os.close(fd)
            high_r, high_w = os.dup(req_r) + 100, os.dup(resp_w) + 100
            os.dup2(req_r, high_r)
            os.dup2(resp_w, high_w)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            status = candidate.candidate_main(code, setup_code, names, program, 3, 4, 1 << 16)
        finally:
            os._exit(status)
    judge_pid = os.fork()
    if judge_pid == 0:  # the judge
        status = 73
        try:
            for fd in (req_r, resp_w, rep_r):
                os.close(fd)
            lines: list[str] = []
            part = (setup_code, compiled, names, entry_point, modules, dict(rules or {}), False)
            judge.judge_main(part, resp_r, req_w, lambda event: lines.append(json.dumps(event)))
            data = ("\n".join(lines) + "\n").encode()
            while data:
                data = data[os.write(rep_w, data):]
            status = 0
        finally:
            os._exit(status)
    for fd in (req_r, req_w, resp_r, resp_w, rep_w):
        os.close(fd)
    data = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not select.select([rep_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            chunk = os.read(rep_r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(rep_r)
        for pid in (judge_pid, child):
            try:
                os.killpg(pid, signal.SIGKILL) if pid == child else None
                os.kill(pid, signal.SIGKILL) if time.monotonic() >= deadline else None
            except ProcessLookupError:
                pass
        _, status = os.waitpid(judge_pid, 0)
        try:
            os.killpg(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(child, 0)
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()], status


def recorded_rules(events: list[dict]) -> dict:
    """The rules a reference's recorded run gives the task's other jobs (as reference.py builds them)."""
    paths = next(e for e in events if e["e"] == "paths")
    return {"mode": "reference", "objects": paths["objects"],
            "names": dict(n.split(":", 1) for n in paths["names"]),
            "skips": {i: int(n) for i, n in (s.split(":") for s in paths["skips"])},
            "delegated": paths.get("delegated", []), "suppressed": paths.get("suppressed", [])}


def judged_against(reference: str, code: str, tests: list[str], **kwargs) -> tuple[list[dict], int]:
    """``code`` judged as a job of a task whose reference is ``reference`` (recorded first)."""
    recorded, _ = judged(reference, tests, rules={"mode": "record"}, **kwargs)
    return judged(code, tests, rules=recorded_rules(recorded), **kwargs)


def verdicts(events: list[dict]) -> list[bool]:
    return [e["ok"] for e in events if e["e"] == "test"]


def failures(events: list[dict]) -> list[dict]:
    return [e for e in events if e["e"] == "test" and not e["ok"]]
