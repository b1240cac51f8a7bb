"""What a task's reference solution says about its tests, found once per task and cached.

Consumes a RewardSpec that carries its task's ``reference`` (the sampler puts it there when it
issues a prompt); produces a :class:`ReferenceCheck`: whether the reference passes every test
under the judge and in its own process, the first test it fails under the judge, and which
calls of the tests gave plain data (``plain_paths``, consumers/executor/runtime/proxies.py). Two sandbox runs per
task, the first time an executor (or ``rollstream score``) meets it; keyed by a digest of what
decides the outcome (setup, tests, entry point, reference, limits), so a changed task is checked
again.

The executor uses it three ways:

* ``plain_paths`` go with every job of the task: where the reference gives plain data, a
  completion object there fails its test (``type_mismatch``), so no completion object is ever
  asked whether it equals an expected value;
* ``trust = "auto"``: the judge for a task whose reference passes under it, in process (marked
  in the execution record and counted) for one whose reference does not. The task decides,
  never the completion;
* a reference that fails under the judge but passes in process is reported, with the failing
  test, the first time (log and ``rollstream_executor_reference_mismatches_total``; in
  ``rollstream score`` output), so the operator can fix the test or set ``trust`` knowingly.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from rollstream.consumers.executor.sandbox import Job, RunResult, SandboxBackend
from rollstream.schemas.events import RewardSpec

log = logging.getLogger(__name__)
CAPACITY = 4096  # tasks remembered per process


class ReferenceCheck(msgspec.Struct, frozen=True, kw_only=True):
    judged: bool  # the reference passes every test under the judge
    in_process: bool  # ... and in its own process
    failing_test: int | None = None  # the first test it fails under the judge
    message: str = ""  # why (that test's error, or what went wrong)
    plain_paths: list[str] = []  # calls of the tests whose every reference result was plain data

    @property
    def mismatch(self) -> bool:
        """The judge cannot honour this task's tests (the reference passes only in process)."""
        return self.in_process and not self.judged

    def trust(self, asked: str) -> str:
        """The trust a job of this task runs under: ``auto`` decided by the reference."""
        if asked != "auto":
            return asked
        return "judge" if self.judged or not self.in_process else "in_process"


def spec_digest(spec: RewardSpec) -> str:
    """What decides a reference check's outcome, hashed."""
    parts = (spec.kind, spec.setup, spec.tests, spec.entry_point, spec.program, spec.reference, spec.timeout_s,
             spec.memory_mb)
    return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()


def _passed(result: RunResult, total: int) -> tuple[bool, int | None, str]:
    """(every test passed, the first that did not, why)."""
    events = result.events
    if result.timed_out or result.violations or "done" not in {e.get("e") for e in events}:
        why = "timed out" if result.timed_out else ", ".join(result.violations) or "did not finish"
        return False, None, why
    for event in events:
        if event.get("e") in ("syntax", "code_error", "setup_error"):
            return False, None, f"{event.get('type')}: {event.get('msg', '')}"
    verdicts = {e.get("i"): e for e in events if e.get("e") == "test"}
    for index in range(total):
        event = verdicts.get(index)
        if event is None or event.get("ok") is not True:
            why = f"{event.get('type')}: {event.get('msg', '')}" if event else "no verdict"
            return False, index, why
    return True, None, ""


async def check_reference(backend: SandboxBackend, spec: RewardSpec, job_id: str) -> ReferenceCheck:
    """Run the reference under the judge (recording which calls gave plain data) and in process."""
    base = dict(code=spec.reference, setup=spec.setup, tests=list(spec.tests), timeout_s=spec.timeout_s,
                memory_mb=spec.memory_mb, entry_point=spec.entry_point, program=spec.program)
    judged, in_process = await asyncio.gather(
        backend.execute(Job(job_id=f"{job_id}/reference-judged", trust="judge", record=True, **base)),
        backend.execute(Job(job_id=f"{job_id}/reference-in-process", trust="in_process", **base)),
    )
    ok, failing, why = _passed(judged, len(spec.tests))
    paths = next((e for e in judged.events if e.get("e") == "paths"), {})
    plain = paths.get("plain") if isinstance(paths.get("plain"), list) else []
    return ReferenceCheck(judged=ok, in_process=_passed(in_process, len(spec.tests))[0], failing_test=failing,
                          message=why[:1000], plain_paths=[p for p in plain if isinstance(p, str)][:1000])


class ReferenceChecks:
    """One check per task digest, shared by every caller (concurrent callers wait for the same
    run), remembered for the last ``capacity`` tasks. ``reported(task, check)`` is called once
    per digest, when its check is first made."""

    def __init__(self, backend: SandboxBackend, *, capacity: int = CAPACITY,
                 reported: Callable[[str, ReferenceCheck], None] | None = None) -> None:
        self.backend = backend
        self.capacity = capacity
        self.reported = reported
        self._done: OrderedDict[str, ReferenceCheck] = OrderedDict()
        self._running: dict[str, asyncio.Task[ReferenceCheck]] = {}

    async def check(self, spec: RewardSpec, task: str = "") -> ReferenceCheck | None:
        """The check of ``spec``'s reference; None when it carries none (or is not a tests task)."""
        if not spec.reference or spec.kind != "python_tests" or not spec.tests:
            return None
        digest = spec_digest(spec)
        found = self._done.get(digest)
        if found is not None:
            self._done.move_to_end(digest)
            return found
        running = self._running.get(digest)
        if running is None:
            running = self._running[digest] = asyncio.ensure_future(check_reference(self.backend, spec, digest[:16]))
            running.add_done_callback(lambda _: self._running.pop(digest, None))
            found = await asyncio.shield(running)
            self._remember(digest, found)
            if self.reported is not None:
                self.reported(task, found)
            return found
        return await asyncio.shield(running)

    def _remember(self, digest: str, check: ReferenceCheck) -> None:
        self._done[digest] = check
        while len(self._done) > self.capacity:
            self._done.popitem(last=False)


def log_check(task: str, check: ReferenceCheck) -> None:
    """The operator's line about a task whose tests the judge cannot honour (or that is broken)."""
    if check.mismatch:
        log.warning("task %s: its reference passes in process but fails under the judge at test %s (%s); "
                    "fix the test, or set trust = \"in_process\" (or \"auto\") knowingly", task,
                    check.failing_test, check.message)
    elif not check.judged:
        log.warning("task %s: its reference fails its own tests (test %s: %s)", task, check.failing_test,
                    check.message)
