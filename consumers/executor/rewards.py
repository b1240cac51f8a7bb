"""Rewards: from a completion and its task's RewardSpec to a sandbox Job, and from the Job's
RunResult to a reward with its components and an ExecutionRecord. Pure functions, no I/O.

A reward kind is anything with the :class:`RewardKind` shape, registered by name in a
:class:`RewardRegistry` and selected by ``RewardSpec.kind``. ``python_tests``, ``python_pytest`` and
``math_answer`` (an :class:`AnswerKind`: checked without a sandbox, consumers/executor/answers.py) are built
in; more kinds plug in through the ``rollstream.rewards`` entry-point group (``name = "pkg.mod:Kind"``) or
by adding to the registry passed to the executor.

``python_tests`` rules (docs/executor.md has the table):

* code = the first fenced block tagged in the task's language (``RewardSpec.language``; Python:
  python/py/python3 or untagged; the others' tags in :data:`LANGUAGE_TAGS`); the whole text when the
  completion has no fence at all; nothing (``no_code``) when it only has fences of other
  languages or is blank. A language this executor cannot compile yet is no reward (``infra``). An unclosed fence (a truncated completion) runs to the end of the text.
* the tests run in a judge the completion cannot reach (``trust = "judge"``: the sandbox's
  runner, see consumers/executor/runtime/judge.py): they see the completion only through plain-data calls.
* no code -> ``no_code_reward``; code that does not compile -> ``syntax_error_reward`` (the
  record carries the error kind, line within the extracted code, and message); timeout ->
  ``timeout_reward``; killed by a signal before the judge finished, out of memory, output over
  the cap, an attack on the sandbox, or an attack on the verdict (``tamper``: messages the
  honest serving code never sends) -> ``crash_reward``. These
  fixed rewards replace the weighted sum; ``components`` then holds ``{"penalty": reward}``.
* otherwise reward = sum(weights[c] * component[c]) with components ``tests`` (fraction of tests
  passed, or 1/0 when ``all_or_nothing``; an exception while defining the code fails them all),
  ``format`` (1 when the code came from a fenced block, else 0) and ``length`` (1 up to
  ``max_length_chars``, then falling linearly to 0 at twice that).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Protocol

import msgspec

from rollstream.consumers.executor.jobs import Job, RunResult
from rollstream.consumers.executor.runtime.programs import COMPILE_ERROR, COMPILER_UNAVAILABLE
from rollstream.registry import Registry
from rollstream.schemas.events import (
    MAX_TEST_MESSAGES,
    MAX_TEST_RESULTS,
    ExecutionRecord,
    RewardSpec,
    TestOutcome,
    TestResult,
)

# What the judge guarantees (docs/executor.md, "The judge") and a test run in the completion's
# own process loses: the tests in another process, plain data only, the tests' objects theirs,
# skips and stops the tests', module names the real modules.
LOST_IN_PROCESS = ("separate_process", "plain_data", "tests_objects", "run_to_end", "module_names")
# trust = "auto" on a task whose spec carries no reference: judged, under the strictest reading (no record of
# what the reference produced: docs/executor.md, "Tasks without a reference")
NO_REFERENCE = "reference_record"
PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})
# The fence tags each language's code is found under (RewardSpec.language); an untagged fence counts for
# Python only (a program in another language is tagged as people tag it).
LANGUAGE_TAGS: dict[str, frozenset[str]] = {
    "python": PYTHON_TAGS,
    "c": frozenset({"c", "h"}),
    "cpp": frozenset({"cpp", "c++", "cxx", "cc", "hpp", "h++", "cplusplus"}),
    "java": frozenset({"java"}),
    "javascript": frozenset({"javascript", "js", "node", "nodejs", "mjs", "cjs"}),
    "go": frozenset({"go", "golang"}),
    "rust": frozenset({"rust", "rs"}),
}
# Languages this executor compiles and runs (runtime/programs.py's toolchains, in the language image): a task
# in another is no reward and no penalty (outcome infra), never judged as Python.
RUNNABLE_LANGUAGES = frozenset({"python", "c", "cpp", "java", "javascript", "go", "rust"})
MAX_REWARD = 1e6
TEXT_LIMIT = 4000
# RunResult.violations that make the verdict "violation" (oom_killed is judged as "oom").
VIOLATIONS = ("runner_", "cleanup_failed", "stray_processes", "judge_")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$", re.MULTILINE)
_SYNTAX_LINE = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)', re.MULTILINE)
_SYNTAX_KIND = re.compile(r"^(?P<kind>SyntaxError|IndentationError|TabError): (?P<msg>.*)$", re.MULTILINE)


class Extraction(msgspec.Struct, frozen=True, kw_only=True):
    """Where the code of a completion came from."""

    code: str | None  # None: nothing to run
    fenced: bool
    language: str = ""


class SyntaxInfo(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # SyntaxError, IndentationError, TabError
    line: int | None
    message: str


class Scored(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on one completion."""

    reward: float
    components: dict[str, float]
    execution: ExecutionRecord


def extract_code(text: str, language: str = "python") -> Extraction:
    """The code of a completion in ``language`` (see the module docstring for the rule; the fence
    tags of each language are :data:`LANGUAGE_TAGS`)."""
    tags = LANGUAGE_TAGS[language]
    fences = list(_FENCE.finditer(text))
    if not fences:
        return Extraction(code=text if text.strip() else None, fenced=False)
    index = 0
    while index < len(fences):
        opening = fences[index]
        marker, language = opening.group(1), opening.group(2).lower()
        closing = next(
            (
                f
                for f in fences[index + 1 :]
                if f.group(1)[0] == marker[0] and len(f.group(1)) >= len(marker) and not f.group(2)
            ),
            None,
        )
        body_end = closing.start() if closing else len(text)
        if language in tags:
            body = text[opening.end() + 1 : body_end] if opening.end() < len(text) else ""
            return Extraction(code=body if body.strip() else None, fenced=True, language=language)
        if closing is None:
            break
        index = fences.index(closing) + 1
    return Extraction(code=None, fenced=True)


def parse_syntax_error(text: str) -> SyntaxInfo | None:
    """A compile error as Python prints it (the last one in ``text``), or None."""
    kinds = list(_SYNTAX_KIND.finditer(text))
    if not kinds:
        return None
    last = kinds[-1]
    lines = [m for m in _SYNTAX_LINE.finditer(text[: last.start()])]
    line = int(lines[-1].group("line")) if lines else None
    return SyntaxInfo(kind=last.group("kind"), line=line, message=last.group("msg").strip())


def passed_tests(events: list[dict], total: int) -> int:
    """Distinct test indices reported passed and never failed (repeats cannot inflate it)."""
    tests = _test_events(events, total)
    failed = {e["i"] for e in tests if e.get("ok") is not True}
    return len({e["i"] for e in tests if e.get("ok") is True} - failed)


def skipped_tests(events: list[dict], total: int) -> int:
    """Distinct test indices the tests themselves skipped (and never reported otherwise)."""
    tests = _test_events(events, total)
    other = {e["i"] for e in tests if not e.get("skip")}
    return len({e["i"] for e in tests if e.get("skip") is True} - other)


PYTEST_KIND = "python_pytest"  # each test a pytest file (consumers/executor/runtime/pytests.py)
MAX_COLLECTED = 4096  # tests one pytest file may collect (runtime/pytests.py MAX_ITEMS)
# Failure types that say a test's check did not hold (the rest: an exception while it ran).
CHECK_FAILURES = frozenset({"AssertionError", "TypeMismatch", "TooLarge", "TestObject", "SkipTest"})
MESSAGE_LIMIT = 500  # characters of one test's message


def per_test_results(events: list[dict], total: int) -> tuple[list[TestResult], int]:
    """Each reported test's result, in test order (a failure reported for an index wins over a
    pass, as in :func:`passed_tests`), bounded by MAX_TEST_RESULTS entries and MAX_TEST_MESSAGES
    characters of messages; and how many were left out."""
    verdict: dict[int, dict] = {}
    for event in _test_events(events, total):
        earlier = verdict.get(event["i"])
        if earlier is None or (earlier.get("ok") is True and event.get("ok") is not True):
            verdict[event["i"]] = event
    results: list[TestResult] = []
    used = omitted = 0
    for index in sorted(verdict):
        event = verdict[index]
        kind = str(event.get("type") or "")[:100]
        outcome: TestOutcome = ("passed" if event.get("ok") is True else "skipped" if event.get("skip") is True
                                else "failed" if kind in CHECK_FAILURES else "error")
        message = "" if outcome == "passed" else str(event.get("msg") or "")[:MESSAGE_LIMIT]
        if len(results) >= MAX_TEST_RESULTS or used + len(message) > MAX_TEST_MESSAGES:
            omitted += 1
            continue
        used += len(message)
        seconds = event.get("d")
        duration = min(float(seconds), 1e6) if isinstance(seconds, (int, float)) and seconds >= 0 else 0.0
        node = event.get("node")
        results.append(TestResult(index=index, outcome=outcome, error_type="" if outcome == "passed" else kind,
                                  message=message, duration_s=duration,
                                  node_id=node[:300] if isinstance(node, str) else ""))
    return results, omitted


def tests_total(spec: RewardSpec, events: list[dict]) -> int:
    """How many tests a verdict counts: one per test statement; for pytest files
    (``python_pytest``) the tests each file collected (the judge's ``collected`` events, in file
    order), a file that reported none (it failed, or the run ended before it) counting as one."""
    if spec.kind != PYTEST_KIND:
        return len(spec.tests)
    counts = [e["n"] for e in events if e.get("e") == "collected" and type(e.get("n")) is int
              and 1 <= e["n"] <= MAX_COLLECTED][: len(spec.tests)]
    return sum(counts) + len(spec.tests) - len(counts)


def _test_events(events: list[dict], total: int) -> list[dict]:
    return [e for e in events if e.get("e") == "test" and isinstance(e.get("i"), int) and 0 <= e["i"] < total]


def tamper_kinds(events: list[dict]) -> list[str]:
    """What the code did to its verdict, as the judge found it (``tamper`` events: messages
    the honest serving code never sends)."""
    return [str(e.get("kind", "unknown"))[:100] for e in events if e.get("e") == "tamper"]


def length_component(completion: str, max_length_chars: int | None) -> float:
    """1 up to the limit, then linearly down to 0 at twice the limit."""
    if max_length_chars is None or len(completion) <= max_length_chars:
        return 1.0
    over = (len(completion) - max_length_chars) / max_length_chars
    return max(0.0, 1.0 - over)


def pass_component(passed: int, total: int, all_or_nothing: bool, ran_cleanly: bool, skipped: int = 0) -> float:
    """passed / the tests that ran (those the tests skipped themselves count neither way); a task
    whose every test was skipped verified nothing: 0."""
    if total == 0:
        return 1.0 if ran_cleanly else 0.0
    counted = total - skipped
    if counted <= 0:
        return 0.0
    if all_or_nothing:
        return 1.0 if passed == counted else 0.0
    return passed / counted


def weighted_reward(weights: Mapping[str, float], components: Mapping[str, float]) -> float:
    total = math.fsum(w * components[name] for name, w in weights.items())
    return min(MAX_REWARD, max(-MAX_REWARD, total))


def _clip(text: str) -> str:
    return text[-TEXT_LIMIT:]


class RewardKind(Protocol):
    """A task type: how to turn a completion into a Job, and a Job's result into a reward."""

    components: frozenset[str]

    def prepare(self, spec: RewardSpec, completion: str, job_id: str) -> Job | Scored:
        """The Job to run, or a final verdict when there is nothing to run."""
        ...

    def score(self, spec: RewardSpec, completion: str, result: RunResult) -> Scored: ...


class AnswerKind:
    """A kind decided without a sandbox (``math_answer``, consumers/executor/answers.py): ``score.evaluate``
    awaits its ``check`` instead of preparing a Job (no container, no reference run); what it parses it
    parses where it says (math_answer: the executor's answer pool, worker processes with a time and a
    memory limit per answer, never the stage's own process). ``close`` ends what it holds."""

    components: frozenset[str] = frozenset()

    async def check(self, spec: RewardSpec, completion: str) -> Scored:
        raise NotImplementedError

    def prepare(self, spec: RewardSpec, completion: str, job_id: str) -> Job | Scored:
        raise TypeError(f"reward kind {spec.kind!r} runs nothing: its verdict is awaited from check()")

    def score(self, spec: RewardSpec, completion: str, result: RunResult) -> Scored:
        raise TypeError(f"reward kind {spec.kind!r} runs nothing: its verdict is awaited from check()")

    def close(self) -> None:
        """Release what the kind holds (worker processes)."""


class PythonTests:
    """``python_tests``: the completion's code, then the spec's tests as statements."""

    components = frozenset({"tests", "format", "length"})
    pytest_files = False  # PytestFiles: each test a pytest file

    def prepare(self, spec: RewardSpec, completion: str, job_id: str) -> Job | Scored:
        if spec.language not in RUNNABLE_LANGUAGES:
            record = ExecutionRecord(sandbox_id="", exit_code=None, duration_s=0.0, error_kind="infra",
                                     error_message=f"this executor does not compile {spec.language} programs yet "
                                     f"(it runs {', '.join(sorted(RUNNABLE_LANGUAGES))}): no reward",
                                     tests_total=len(spec.tests), trust=spec.trust)
            return Scored(reward=0.0, components={}, execution=record)
        extraction = extract_code(completion, spec.language)
        if extraction.code is None:
            record = ExecutionRecord(
                sandbox_id="",
                exit_code=None,
                duration_s=0.0,
                error_kind="no_code",
                error_message=f"no {spec.language} code found in the completion",
                tests_total=len(spec.tests),
                trust=spec.trust,
            )
            return _penalty(spec.no_code_reward, record)
        return Job(
            job_id=job_id,
            code=extraction.code,
            setup=spec.setup,
            tests=list(spec.tests),
            timeout_s=spec.timeout_s,
            memory_mb=spec.memory_mb,
            entry_point=spec.entry_point,
            program=spec.program,
            language=spec.language,
            pytest=self.pytest_files,
            trust="judge" if spec.trust == "mixed" or spec.language != "python" else spec.trust,
            assets=list(spec.assets),
            network=list(spec.network),
        )

    def score(self, spec: RewardSpec, completion: str, result: RunResult) -> Scored:
        events = result.events
        kinds = {e.get("e") for e in events}
        total = tests_total(spec, events)
        passed = passed_tests(events, total)
        skipped = skipped_tests(events, total)
        results, omitted = per_test_results(events, total)
        in_process = list(range(total)) if spec.trust == "in_process" else list(result.in_process_tests)
        base = dict(
            sandbox_id=result.sandbox_id,
            exit_code=result.exit_code,
            duration_s=max(0.0, result.duration_s),
            timed_out=result.timed_out,
            oom=result.oom_killed,
            tests_passed=passed,
            tests_total=total,
            stdout_tail=_clip(result.stdout_tail),
            stderr_tail=_clip(result.stderr_tail),
            trust=spec.trust,
            tests_skipped=skipped,
            lost_guarantees=list(LOST_IN_PROCESS) if in_process else [],
            in_process_tests=in_process[:1000],
            test_results=results,
            test_results_omitted=omitted,
        )
        failure = _failure(spec, result, events, kinds)
        if failure is not None:
            kind, reward, message, line = failure
            base["oom"] = base["oom"] or kind == "oom"
            if kind == "tamper":
                base["tamper"] = ",".join(tamper_kinds(events))[:TEXT_LIMIT]
            record = ExecutionRecord(
                **base, error_kind=kind, error_message=message[:TEXT_LIMIT], error_line=line
            )
            return _penalty(reward, record)
        code_error = next((e for e in events if e.get("e") in ("code_error", "setup_error")), None)
        gone = next((e for e in events if e.get("e") == "gone"), None)
        finished = "done" in kinds
        if code_error is not None:
            kind, message = "runtime", f"{code_error.get('type')}: {code_error.get('msg', '')}"
            if code_error.get("e") == "setup_error":
                message = "task setup failed: " + message
        elif gone is not None:
            kind = "runtime"
            message = (
                f"the code stopped answering before test {gone.get('i')} "
                f"({gone.get('msg', '')}; exit code {result.exit_code})"
            )
        elif not finished:
            kind, message = "runtime", f"exited before the tests finished (exit code {result.exit_code})"
        elif any(e.get("type") == "TooLarge" for e in _test_events(events, total)):
            too_large = next(e for e in _test_events(events, total) if e.get("type") == "TooLarge")
            kind, message = "too_large", f"test {too_large['i']}: {too_large.get('msg', '')}"
        else:
            kind, message = "none", ""
        extraction = extract_code(completion, spec.language)
        components = {
            "tests": pass_component(passed, total, spec.all_or_nothing, kind == "none", skipped),
            "format": 1.0 if extraction.fenced else 0.0,
            "length": length_component(completion, spec.max_length_chars),
        }
        record = ExecutionRecord(
            **base,
            error_kind=kind,
            error_message=message[:TEXT_LIMIT],
            error_line=code_error.get("line") if code_error else None,
        )
        return Scored(
            reward=weighted_reward(spec.weights, components), components=components, execution=record
        )


class PytestFiles(PythonTests):
    """``python_pytest``: the completion's code, then each of the spec's tests as a pytest file
    (``from solution import ...``; test functions and classes, parametrize, fixtures, ``raises``,
    ``approx``), run by the judge (consumers/executor/runtime/pytests.py): each collected test is
    one test of the verdict, named by its node id. The rules are ``python_tests``'."""

    pytest_files = True


def _failure(spec: RewardSpec, result: RunResult, events: list[dict], kinds: set) -> tuple | None:
    """(error_kind, fixed reward, message, line) when the execution ended in a penalty."""
    attacked = [v for v in result.violations if v.startswith("runner_zygote")]  # only code can do that
    tamper = tamper_kinds(events)
    if result.timed_out and not attacked and not tamper:
        return "timeout", spec.timeout_reward, f"wall-clock limit of {spec.timeout_s:g}s exceeded", None
    if result.runner_died and result.oom_killed:  # the memory limit took the runner with the job
        return "oom", spec.crash_reward, f"memory limit of {spec.memory_mb} MB exceeded", None
    if result.runner_died or any(v.startswith(VIOLATIONS) for v in result.violations):
        return "violation", spec.crash_reward, "sandbox violation: " + ", ".join(result.violations), None
    if tamper:
        detail = next((str(e.get("msg", ""))[:500] for e in events if e.get("e") == "tamper"), "")
        message = "tampering with the verdict: " + ", ".join(tamper) + (f" ({detail})" if detail else "")
        return "tamper", spec.crash_reward, message, None
    if result.output_limit:
        return "output_limit", spec.crash_reward, f"output over the cap ({result.output_bytes} bytes)", None
    memory_error = any(e.get("type") == "MemoryError" for e in events) or result.exit_code == 71
    if result.oom_killed or memory_error:
        return "oom", spec.crash_reward, f"memory limit of {spec.memory_mb} MB exceeded", None
    syntax = next((e for e in events if e.get("e") == "syntax"), None)
    if syntax is not None and syntax.get("type") == COMPILER_UNAVAILABLE:  # the machinery's: never a penalty
        return "infra", 0.0, f"the sandbox could not build {spec.language}: {syntax.get('msg', '')}", None
    if syntax is not None and syntax.get("type") == COMPILE_ERROR:
        return "compile_error", spec.compile_error_reward, f"{spec.language} compile error: {syntax.get('msg', '')}", None
    if syntax is not None:
        parsed = parse_syntax_error(result.stderr_tail)
        line = syntax.get("line") if syntax.get("line") is not None else (parsed.line if parsed else None)
        message = f"{syntax.get('type', 'SyntaxError')}: {syntax.get('msg', '')}"
        return "syntax", spec.syntax_error_reward, message, line
    # With a judge, the code's exit status does not matter once every test was answered.
    unanswered = spec.trust == "in_process" or "done" not in kinds or any(e.get("e") == "gone" for e in events)
    if result.signal is not None and unanswered:
        return "crash", spec.crash_reward, f"killed by signal {result.signal}", None
    if "compiled" not in kinds and "setup_error" not in kinds:
        return "crash", spec.crash_reward, f"the harness did not start (exit code {result.exit_code})", None
    return None


def _penalty(reward: float, record: ExecutionRecord) -> Scored:
    return Scored(reward=reward, components={"penalty": reward}, execution=record)


class RewardRegistry:
    """Reward kinds by name. Built per executor (no module-level state).

    A kind that scores without running anything (``prepare`` returns the verdict)::

        >>> from rollstream.consumers.executor.rewards import PythonTests, RewardRegistry, Scored
        >>> from rollstream.schemas import ExecutionRecord, RewardSpec
        >>> class Short:
        ...     components = frozenset({"length"})
        ...     def prepare(self, spec, completion, job_id):
        ...         record = ExecutionRecord(sandbox_id="", exit_code=None, duration_s=0.0, error_kind="none")
        ...         short = float(len(completion) <= 80)
        ...         return Scored(reward=short, components={"length": short}, execution=record)
        ...     def score(self, spec, completion, result):
        ...         raise AssertionError("nothing runs")
        >>> registry = RewardRegistry({"python_tests": PythonTests()})
        >>> registry.register("short", Short())
        >>> registry.names()
        ['python_tests', 'short']
        >>> spec = RewardSpec(kind="short", weights={"length": 1.0})
        >>> registry.get(spec).prepare(spec, "print(1)", "job-1").reward
        1.0

    Ship it as ``[project.entry-points."rollstream.rewards"] short = "mypkg.rewards:Short"``
    (:func:`default_registry` loads the group in every executor) and tasks select it with
    ``RewardSpec.kind = "short"``.
    """

    def __init__(self, kinds: Mapping[str, RewardKind] | None = None) -> None:
        # the project's one registry (rollstream/registry.py), its group loaded by default_registry
        self._kinds: Registry[RewardKind] = Registry(
            "reward kind", ENTRY_POINTS, "RewardRegistry.register", dict(kinds or {}), lazy=False)

    def register(self, name: str, kind: RewardKind) -> None:
        self._kinds.register(name, kind)

    def load_entry_points(self, found: Iterable[metadata.EntryPoint] | None = None) -> None:
        """Register the kinds of the ``rollstream.rewards`` entry-point group (or those ``found``):
        each names a kind's class (or a factory), called once."""
        for entry in metadata.entry_points(group=ENTRY_POINTS) if found is None else found:
            self.register(entry.name, entry.load()())

    def names(self) -> list[str]:
        return self._kinds.names()

    def get(self, spec: RewardSpec) -> RewardKind:
        """The kind for ``spec``; ValueError when unknown or when it weights unknown components."""
        kind = self._kinds.get(spec.kind)
        unknown = set(spec.weights) - set(kind.components)
        if unknown:
            raise ValueError(
                f"reward kind {spec.kind!r} has no component(s) {sorted(unknown)}; "
                f"it has {sorted(kind.components)}"
            )
        return kind

    def close(self) -> None:
        """End what the kinds hold (the answer kinds' worker processes); the registry may be used again."""
        for name in self.names():
            kind = self._kinds.get(name)
            if isinstance(kind, AnswerKind):
                kind.close()


ENTRY_POINTS = "rollstream.rewards"


def default_registry(entry_points: Iterable[metadata.EntryPoint] | None = None) -> RewardRegistry:
    """``python_tests``, ``python_pytest``, ``math_answer`` (its worker pool started on first use) and every
    kind in the ``rollstream.rewards`` entry-point group."""
    from rollstream.consumers.executor.answers import MATH_KIND, MathAnswer

    registry = RewardRegistry({"python_tests": PythonTests(), PYTEST_KIND: PytestFiles(), MATH_KIND: MathAnswer()})
    registry.load_entry_points(entry_points)
    return registry
