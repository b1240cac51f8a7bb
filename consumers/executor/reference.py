"""What a task's reference solution says about its tests, found once per task and cached.

Consumes a RewardSpec that carries its task's ``reference`` (the sampler puts it there when it
issues a prompt); produces a :class:`ReferenceCheck`: whether the reference passes every test
under the judge and in its own process, the tests it fails under the judge, and what it produced
as the judge saw it: where completion objects crossed (``objects``), how it bound the names the
tests read (``names``) and which of its tests the tests themselves skipped (``skips``;
consumers/executor/runtime/crossing.py ``Rules``). Two sandbox runs per task, the first time an
executor (or ``rollstream score``) meets it; keyed by a digest of what decides the outcome
(setup, tests, entry point, reference, limits), so a changed task is checked again.

The executor uses it three ways:

* its :meth:`ReferenceCheck.rules` go with every job of the task: where the reference gives
  plain data, a completion object there fails its test (``type_mismatch``);
* ``trust = "auto"``: the judge for a task whose reference passes under it; for one whose
  reference fails some tests under the judge but passes them in process, those tests only run in
  process (``trust: "mixed"``, with ``in_process_tests`` and the ``lost_guarantees`` in the
  execution record, counted). The task decides, never the completion;
* a reference that fails under the judge but passes in process is reported, with the failing
  tests, the first time (log and ``rollstream_executor_reference_mismatches_total``; in
  ``rollstream score`` output and ``rollstream tasks check``), so the operator can fix the test
  or set ``trust`` knowingly.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable

import msgspec

from rollstream.consumers.executor.jobs import Job, RunResult, SandboxBackend
from rollstream.consumers.executor.rewards import LOST_IN_PROCESS, PYTEST_KIND, tests_total
from rollstream.schemas.events import RewardSpec

log = logging.getLogger(__name__)
CAPACITY = 4096  # tasks remembered per process


class ReferenceCheck(msgspec.Struct, frozen=True, kw_only=True):
    judged: bool  # the reference passes every test under the judge
    in_process: bool  # ... and in its own process
    failing_test: int | None = None  # the first test it fails under the judge
    message: str = ""  # why (that test's error, or what went wrong)
    judge_failing: list[int] = []  # every test it fails under the judge
    recorded: bool = False  # the judge's run recorded what the reference produced
    objects: list[str] = []  # points where the reference's objects crossed into the tests
    names: dict[str, str] = {}  # how it bound the names the tests read ("o", "p", "m", "m:<module>", "s:<module>:<name>")
    skips: dict[str, int] = {}  # test index -> unittest tests the tests skipped (-1: the whole test)
    delegated: list[str] = []  # points where the tests had the candidate run code from data
    suppressed: list[str] = []  # points where the reference's __exit__ swallowed an exception
    tests: int = 0
    pytest: bool = False  # the tests are pytest files (python_pytest): ``tests`` counts what they collected
    collected: list[int] = []  # pytest files: the tests the reference's run under the judge collected, per file

    @property
    def mismatch(self) -> bool:
        """The judge cannot honour some of this task's tests (the reference passes them only in process)."""
        return self.in_process and not self.judged

    @property
    def all_skipped(self) -> bool:
        """Every test of the task was skipped by the tests themselves: it verifies nothing."""
        return self.tests > 0 and all(self.skips.get(str(i)) == -1 for i in range(self.tests))

    def trust(self, asked: str) -> str:
        """The trust a job of this task runs under: ``auto`` decided by the reference."""
        if asked != "auto":
            return asked
        if self.judged or not self.in_process:
            return "judge"
        # a test of a pytest file is no statement to run apart: the whole task runs in process
        return "in_process" if len(self.judge_failing) >= self.tests or self.pytest else "mixed"

    @property
    def in_process_tests(self) -> list[int]:
        """With trust "mixed": the tests that run in the completion's process."""
        return list(self.judge_failing) if self.mismatch else []

    def rules(self) -> dict:
        """What the task's other jobs are held to (crossing.Rules); the strictest reading when the
        reference's run recorded nothing or the reference itself is broken."""
        if not self.recorded or not (self.judged or self.in_process):
            return {}
        rules = {"mode": "reference", "objects": list(self.objects), "names": dict(self.names),
                 "skips": dict(self.skips), "delegated": list(self.delegated), "suppressed": list(self.suppressed)}
        if self.collected:  # each file's count is the expectation (a file parametrized over the completion's data)
            rules["collected"] = list(self.collected)
        return rules


def spec_digest(spec: RewardSpec) -> str:
    """What decides a reference check's outcome, hashed."""
    parts = (spec.kind, spec.setup, spec.tests, spec.entry_point, spec.program, spec.reference, spec.timeout_s,
             spec.memory_mb, sorted([a.path, a.digest] for a in spec.assets),
             sorted(spec.network)) + ((spec.language,) if spec.language != "python" else ())
    return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()


def _outcomes(result: RunResult, total: int) -> tuple[list[int], str]:
    """(the tests not passed, why the first was not): a test the tests skipped themselves counts
    as passed here (a reference cannot do better than the tests let it)."""
    events = result.events
    if result.timed_out or result.violations or "done" not in {e.get("e") for e in events}:
        why = "timed out" if result.timed_out else ", ".join(result.violations) or "did not finish"
        return list(range(total)), why
    for event in events:
        if event.get("e") in ("syntax", "code_error", "setup_error"):
            return list(range(total)), f"{event.get('type')}: {event.get('msg', '')}"
    verdicts = {e.get("i"): e for e in events if e.get("e") == "test"}
    failing, why = [], ""
    for index in range(total):
        event = verdicts.get(index)
        if event is None or (event.get("ok") is not True and not event.get("skip")):
            if not failing:
                why = f"{event.get('type')}: {event.get('msg', '')}" if event else "no verdict"
            failing.append(index)
    return failing, why


async def check_reference(backend: SandboxBackend, spec: RewardSpec, job_id: str) -> ReferenceCheck:
    """Run the reference under the judge (recording what crossed) and in process."""
    pytest_files = spec.kind == PYTEST_KIND
    base = dict(code=spec.reference, setup=spec.setup, tests=list(spec.tests), timeout_s=spec.timeout_s,
                memory_mb=spec.memory_mb, entry_point=spec.entry_point, program=spec.program, pytest=pytest_files,
                assets=list(spec.assets), network=list(spec.network))
    judged, in_process = await asyncio.gather(
        backend.execute(Job(job_id=f"{job_id}/reference-judged", trust="judge", rules={"mode": "record"}, **base)),
        backend.execute(Job(job_id=f"{job_id}/reference-in-process", trust="in_process", **base)),
    )
    total = tests_total(spec, judged.events)
    failing, why = _outcomes(judged, total)
    paths = next((e for e in judged.events if e.get("e") == "paths"), None)
    names, skips = {}, {}
    objects, delegated, suppressed = (_points(paths, key) for key in ("objects", "delegated", "suppressed"))
    if isinstance(paths, dict):
        for entry in paths.get("names", []):
            name, _, kind = str(entry).partition(":")
            if name and (kind in ("o", "p", "m") or kind[:2] in ("m:", "s:")):
                names[name] = kind[:300]
        for entry in paths.get("skips", []):
            index, _, count = str(entry).partition(":")
            if index.isdigit() and count.lstrip("-").isdigit():
                skips[index] = int(count)
    collected = [e["n"] for e in judged.events if e.get("e") == "collected" and type(e.get("n")) is int]
    collected = collected if pytest_files and not failing and len(collected) == len(spec.tests) else []
    return ReferenceCheck(judged=not failing, in_process=not _outcomes(in_process, tests_total(spec, in_process.events))[0],
                          failing_test=failing[0] if failing else None, message=why[:1000], judge_failing=failing,
                          recorded=paths is not None, objects=objects, names=names, skips=skips, delegated=delegated,
                          suppressed=suppressed, tests=total, pytest=pytest_files, collected=collected)


def _points(paths: object, key: str) -> list[str]:
    """The points the reference's record lists under ``key`` (at most 4096)."""
    listed = paths.get(key, []) if isinstance(paths, dict) else []
    return [p for p in listed if isinstance(p, str)][:4096] if isinstance(listed, list) else []


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
        if not spec.reference or spec.kind not in ("python_tests", PYTEST_KIND) or not spec.tests:
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
        log.warning("task %s: its reference passes in process but fails under the judge at tests %s (first: %s); "
                    "fix the test, or set trust = \"auto\" knowingly (those tests then run in process, losing %s)",
                    task, check.judge_failing, check.message, ", ".join(LOST_IN_PROCESS))
    elif check.all_skipped:
        log.warning("task %s: every one of its tests is skipped by the tests themselves: it verifies nothing", task)
    elif not check.judged:
        log.warning("task %s: its reference fails its own tests (test %s: %s)", task, check.failing_test,
                    check.message)
