"""The events that flow between rollstream's stages.

Every value on every topic is one of these msgspec Structs, encoded as MessagePack.

Compatibility rule (``schema_version``)
---------------------------------------
Structs are encoded as maps keyed by field name, so:

* Adding a field is backwards compatible **only if it has a default**. Old writers
  omit it, new readers fill in the default; old readers ignore it (unknown keys are
  skipped). Such a change keeps ``SCHEMA_VERSION``.
* Removing a field, renaming it, changing its type, or tightening a limit so that
  old events would fail validation is a breaking change: bump ``SCHEMA_VERSION``
  and give the topic a new name (``prompts.v2``), so that replaying an old topic
  still decodes with the old definition.
* A type change whose new readers still accept the old form keeps the topic names but
  bumps ``SCHEMA_VERSION``, so that old readers dead-letter what they cannot read
  instead of misreading it.
* Writers always write the current ``SCHEMA_VERSION``; readers accept any version
  ``<= SCHEMA_VERSION`` and dead-letter newer ones (a newer writer may rely on
  fields this reader does not know).

History: version 2 carries token ids, log-probs and generated masks as packed arrays
(:mod:`rollstream.schemas.arrays`) instead of MessagePack arrays of numbers; version-1 events
still decode. Version 3 adds the ``tamper`` error kind (a new value that version-2
readers would reject) with ``ExecutionRecord.tamper``/``trust`` and
``RewardSpec.trust``/``program`` (defaulted, so version-2 events still decode). Version 4 adds the
``too_large`` error kind and the ``mixed`` trust (new values version-3 readers would reject),
with ``ExecutionRecord.tests_skipped``/``lost_guarantees``/``in_process_tests`` and
``RewardSpec.returns_objects`` (defaulted: version-3 events still decode). Version 5 adds the typed
``outcome`` of ``RewardScored`` and ``SandboxAudit`` (derived from the error kind when an older
event omits it) and the rollouts a group left out (``GroupAdvantaged.excluded``,
``GroupFate.excluded``; ``GroupAdvantaged.rollouts`` may then be empty): from version 5 an
``infra`` outcome is never a reward, which a version-4 reader would take for one. Version 5 also
adds the signed ``attestation`` of a verdict (defaulted). ``ExecutionRecord.test_results`` /
``test_results_omitted`` (each test's result) are defaulted fields: version unchanged, and so is
``Attestation.digests`` (the per-field digests of a v2 signature: empty in a v1 one), and so are the
``math_answer`` fields (``RewardSpec.answer``/``answer_format``/``answer_pattern``/``answer_tolerance``,
``ExecutionRecord.answer_check``), and so is ``EvalReported.domains`` (per-domain figures: empty in
an older report), and so is ``Rollout.domain`` (the task's domain: empty in an older rollout).

``tests/schemas/test_compat.py`` holds frozen copies of the version-1 shapes and
checks that what they wrote still decodes.

Timestamps are Unix seconds (float) set by the writer; they have no defaults.
"""

from __future__ import annotations

import keyword
import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from rollstream.schemas.arrays import MAX_TOKENS, LogProbArray, MaskArray, PackedArray, TokenArray

SCHEMA_VERSION = 5

# Limits. Floats bounded on both sides also reject NaN and +-inf.
Finite = Annotated[float, Meta(ge=-1e9, le=1e9)]
Reward = Annotated[float, Meta(ge=-1e6, le=1e6)]
Seconds = Annotated[float, Meta(ge=0.0, le=1e7)]
Timestamp = Annotated[float, Meta(ge=0.0, le=1e11)]
Version = Annotated[int, Meta(ge=0)]
Id = Annotated[str, Meta(min_length=1, max_length=256)]
ShortText = Annotated[str, Meta(max_length=4096)]
Text = Annotated[str, Meta(max_length=1 << 20)]
SchemaVersion = Annotated[int, Meta(ge=1, le=SCHEMA_VERSION)]

FinishReason = Literal["stop", "length", "abort", "error"]
# Where a python_tests verdict is decided: a judge process the completion cannot reach, or the
# completion's own process (for tasks that need its objects there; marked in the record), or
# both: "mixed", the tests the judge cannot honour in process (ExecutionRecord.in_process_tests).
Trust = Literal["judge", "in_process", "mixed"]
# Where a task's verdicts are decided: "auto" lets the task's reference choose (the judge when
# it passes there, in process when it does not); an execution record names the one used.
TaskTrust = Literal["judge", "in_process", "auto"]
# The language a task's completion is written in: Python, or a whole program in one of the others,
# compiled in the sandbox and run by the judge's tests over its standard input and output.
Language = Literal["python", "c", "cpp", "java", "javascript", "go", "rust"]
# Where a ``math_answer`` completion's answer is read: the last \\boxed{...} (braces balanced), GSM8K's
# "#### n", the last "the answer is ...", or the task's own regex (RewardSpec.answer_pattern).
AnswerFormat = Literal["boxed", "gsm8k", "the_answer_is", "regex"]
MAX_ANSWER_PATTERN = 256  # characters of a task's answer regex (plain data: compiled, never evaluated)
ErrorKind = Literal[
    "none",  # ran and exited cleanly (tests may still have failed)
    "no_code",  # nothing to run was found in the completion
    "syntax",  # the code does not compile
    "compile_error",  # a program in another language did not build (its compiler's first errors in the message)
    "runtime",  # an exception escaped (including failed asserts)
    "timeout",  # wall-clock limit hit, killed
    "oom",  # memory limit hit, killed
    "output_limit",  # stdout/stderr over the cap, killed
    "violation",  # the sandbox itself was attacked (runner killed, escape attempt)
    "tamper",  # the code attacked its verdict: the judge process or the channel to it
    "too_large",  # a value over the size or depth limits of the boundary (that test failed, not a penalty)
    "crash",  # died by a signal
    "infra",  # the sandbox failed for reasons not caused by the code
]
# What became of one execution, from one closed set (ErrorKind is the detail): the code's verdict
# (passed, failed: ran cleanly and some test failed; error: it did not run cleanly: no code, a
# syntax error, an exception, a crash, an output flood; timeout; oom; too_large; violation: it
# attacked the sandbox or its verdict), or ``infra``: the machinery failed (a sandbox lost mid-job,
# no completion to run), which is never a reward: the stream resolves the group without it.
Outcome = Literal["passed", "failed", "error", "timeout", "oom", "too_large", "violation", "infra"]
OUTCOMES: tuple[str, ...] = Outcome.__args__  # type: ignore[attr-defined]
_OUTCOME_OF_KIND: dict[str, str] = {
    "no_code": "error", "syntax": "error", "compile_error": "error", "runtime": "error", "output_limit": "error", "crash": "error",
    "timeout": "timeout", "oom": "oom", "too_large": "too_large", "violation": "violation",
    "tamper": "violation", "infra": "infra",
}


def outcome_of(error_kind: str, passed: bool) -> Outcome:
    """The outcome an execution with ``error_kind`` (and, when it ran cleanly, ``passed``) has."""
    if error_kind == "none":
        return "passed" if passed else "failed"
    return _OUTCOME_OF_KIND[error_kind]  # type: ignore[return-value]


# The packed-array fields of Rollout and Continuation (both have all four).
_PACKED_FIELDS: tuple[tuple[str, type[PackedArray]], ...] = (
    ("prompt_token_ids", TokenArray), ("completion_token_ids", TokenArray),
    ("behaviour_logprobs", LogProbArray), ("generated_mask", MaskArray),
)


def _pack_fields(struct: msgspec.Struct, fields: tuple[tuple[str, type[PackedArray]], ...]) -> None:
    """Convert list values given to a constructor into their packed arrays (decoding already
    builds them: this is one type check per field there)."""
    for name, cls in fields:
        value = getattr(struct, name)
        if value is not None and type(value) is not cls:
            msgspec.structs.force_setattr(struct, name, cls.coerce(value))


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every event: carries the schema version of its writer."""

    schema_version: SchemaVersion = SCHEMA_VERSION


class Message(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Per-prompt sampling overrides; ``None`` means the generator's configured value."""

    temperature: Annotated[float, Meta(ge=0.0, le=10.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    max_new_tokens: Annotated[int, Meta(ge=1, le=MAX_TOKENS)] | None = None
    stop: Annotated[list[ShortText], Meta(max_length=16)] | None = None
    seed: int | None = None


class Subtask(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a task that is worked through in order, one or more turns each
    (consumers/executor/episodes.py). The code of the steps passed stays with the episode."""

    instruction: Text
    tests: Annotated[list[Text], Meta(max_length=1000)]
    reference: Text | None = None  # a solution of this step (suite checks, the scripted backend)


# An asset's place under /assets: a relative POSIX path of plain names ("data/scores.json"). Every
# pattern here ends in \Z, never $: msgspec searches with Python's re, where $ also matches before a
# trailing newline ("data.json\n" would pass).
AssetPath = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*\Z")]
Sha256 = Annotated[str, Meta(pattern=r"^sha256:[0-9a-f]{64}\Z")]


# A host a task's sandboxes may reach through the egress proxy: "host:port" (that host exactly) or
# ".domain:port" (any host under the domain); nothing wider (consumers/executor/runtime/egress.py).
EgressEntry = Annotated[str, Meta(max_length=260, pattern=r"^\.?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.?:[0-9]{1,5}\Z")]


class Asset(msgspec.Struct, frozen=True, kw_only=True):
    """A file or directory a task's sandboxes read at ``/assets/<path>``, read-only.

    ``url`` is an fsspec URL (``s3://bucket/data.json``, ``file:///srv/assets/game``, a local
    path); ``digest`` pins its content: a file's sha256, or for a directory the sha256 over its
    files' relative paths and digests (consumers/executor/assets.py ``tree_digest``). The
    executor fetches each once into a content-addressed cache and refuses content that does
    not match (docs/executor.md, "Assets")."""

    path: AssetPath
    url: Annotated[str, Meta(min_length=1, max_length=2048)]
    digest: Sha256


class RewardSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How to score a completion. ``kind`` names an entry of the reward registry.

    For ``python_tests``: the completion's code (from the first fenced block, or the
    whole text) is run with ``setup`` before it; each string in ``tests`` (a statement,
    usually an ``assert``) runs in order in a judge process that holds the task's
    ``setup`` too and reaches the completion only through plain-data calls
    (``trust = "judge"``; ``"in_process"`` runs the tests in the completion's own process,
    which can then fake its verdicts); ``entry_point`` is the name the completion must
    define. With ``program`` the completion is a whole program: tests call
    ``run_program(stdin)`` and get its standard output. The score is the weighted sum of
    the ``weights`` components.

    ``python_pytest``: the same, with each string in ``tests`` a pytest file (``from solution
    import ...``, test functions and classes, fixtures, parametrize), run by the judge with
    pytest; every test it collects is one test of the verdict.
    """

    kind: Id = "python_tests"
    entry_point: ShortText = ""
    tests: Annotated[list[Text], Meta(max_length=1000)] = []
    setup: Text = ""
    timeout_s: Annotated[float, Meta(gt=0.0, le=600.0)] = 5.0
    memory_mb: Annotated[int, Meta(ge=16, le=65536)] = 256
    all_or_nothing: bool = False
    weights: dict[Id, Finite] = msgspec.field(default_factory=lambda: {"tests": 1.0})
    syntax_error_reward: Reward = -0.5
    compile_error_reward: Reward = -0.5  # a program in another language that did not build
    timeout_reward: Reward = -0.2
    crash_reward: Reward = -0.2
    no_code_reward: Reward = -1.0
    max_length_chars: Annotated[int, Meta(ge=1)] | None = None
    subtasks: Annotated[list[Subtask], Meta(max_length=64)] = []
    turn_penalty: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.0  # multi-turn: taken off per turn after the first
    trust: TaskTrust = "judge"
    program: bool = False
    # The task's reference solution, put here by the sampler when it issues a prompt: the
    # executor runs it once per task (consumers/executor/reference.py). Never shown to the model.
    reference: Text = ""
    # A task without a reference whose entry points return the completion's own objects (a class
    # whose methods return instances): without it, such a task's calls must give plain data.
    returns_objects: bool = False
    # Read-only files the task's code and tests read under /assets (an executor older than this
    # field runs the task without them: its tests fail, never pass, for want of the files).
    assets: Annotated[list[Asset], Meta(max_length=32)] = []
    # Hosts the task's code may reach through the executor's egress proxy (HTTP, HTTPS CONNECT);
    # empty: network none (docs/executor.md, "Network"). An older executor ignores it: no network.
    network: Annotated[list[EgressEntry], Meta(max_length=32)] = []
    # The completion's language: "python", or a whole program (``program``) in another, its code the
    # first fenced block tagged in that language; the tests stay Python over run_program(stdin).
    language: Language = "python"
    # ``math_answer`` (consumers/executor/answers.py, docs/tasks.md "Math answers"): the gold answer as the
    # dataset gives it (a number, LaTeX, a GSM8K solution ending "#### n", a MATH solution with \\boxed{});
    # where the completion's answer is read (``answer_format``; "regex": ``answer_pattern``, its group 1
    # or the whole match); two numbers within ``answer_tolerance`` (relative, of max(1, |gold|)) are equal.
    answer: Text = ""
    answer_format: AnswerFormat = "boxed"
    answer_pattern: Annotated[str, Meta(max_length=MAX_ANSWER_PATTERN)] = ""
    answer_tolerance: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None

    def __post_init__(self) -> None:
        if self.entry_point and not (self.entry_point.isidentifier() and not keyword.iskeyword(self.entry_point)):
            raise ValueError(f"entry_point {self.entry_point[:80]!r} is not a Python identifier (the name the "
                             "completion defines and the tests call)")
        if self.language != "python" and (not self.program or self.kind != "python_tests" or self.subtasks):
            raise ValueError(f"a {self.language} task is a whole program judged by Python tests over its input and "
                             "output: kind 'python_tests', program = true and no subtasks (its tests call "
                             "run_program(stdin) and read what it prints)")
        if self.kind == "python_pytest" and self.program:
            raise ValueError("kind 'python_pytest' runs pytest files against the completion's functions: "
                             "program must be false (a stdin/stdout program's tests call run_program)")
        if self.kind == "math_answer":
            _check_math_answer(self)


def _check_math_answer(spec: RewardSpec) -> None:
    """What a ``math_answer`` spec needs: a gold answer, nothing to run, a pattern that is plain data."""
    if not spec.answer.strip():
        raise ValueError("kind 'math_answer' needs the gold answer (RewardSpec.answer)")
    if spec.tests or spec.subtasks or spec.setup or spec.program or spec.entry_point or spec.language != "python":
        raise ValueError("kind 'math_answer' compares an answer with RewardSpec.answer: it runs nothing (no tests, "
                         "subtasks, setup, program, entry_point or language)")
    if (spec.answer_format == "regex") != bool(spec.answer_pattern):
        raise ValueError("answer_pattern goes with answer_format 'regex' (and only with it)")
    if spec.answer_pattern:
        try:  # compiled, never evaluated; run by the executor's answer workers under their time limit
            re.compile(spec.answer_pattern)
        except (re.error, RecursionError, OverflowError) as exc:
            raise ValueError(f"answer_pattern does not compile: {exc}") from None
    if spec.weights == {"tests": 1.0}:  # the field's default: this kind's is {"answer": 1.0}
        msgspec.structs.force_setattr(spec, "weights", {"answer": 1.0})


class WorkspaceFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file an episode's code left in its sandbox, carried to its next turn."""

    path: ShortText
    data: Annotated[bytes, Meta(max_length=256 << 10)]


Workspace = Annotated[list[WorkspaceFile], Meta(max_length=256)]


class Continuation(msgspec.Struct, frozen=True, kw_only=True):
    """A later turn of one sample of a multi-turn episode (consumers/executor/episodes.py).

    The transcript so far travels as tokens: ``generated_mask[i]`` is 1 where
    ``completion_token_ids[i]`` was produced by the model (and has a behaviour
    log-prob) and 0 where it came from the environment (an observation).
    """

    sample_index: Annotated[int, Meta(ge=0)]
    turn: Annotated[int, Meta(ge=1)]
    messages: Annotated[list[Message], Meta(max_length=1024)]
    prompt_token_ids: TokenArray
    completion_token_ids: TokenArray
    generated_mask: MaskArray
    behaviour_logprobs: LogProbArray
    observation: Text
    policy_versions: Annotated[list[Version], Meta(max_length=1024)] = []
    subtask_index: Annotated[int, Meta(ge=0)] = 0
    carried_code: Text = ""  # a subtask chain: the code of the steps passed, run before this turn's
    workspace: Workspace = []  # the files the episode's code left in its sandbox so far

    def __post_init__(self) -> None:
        _pack_fields(self, _PACKED_FIELDS)


class PromptIssued(Event, frozen=True, kw_only=True):
    """One group to generate: ``group_size`` samples of ``messages``.

    With ``continuation`` set, it asks for one more turn of a single sample instead.
    """

    group_id: Id
    task_id: Id
    family: Id
    messages: Annotated[list[Message], Meta(min_length=1, max_length=1024)]
    group_size: Annotated[int, Meta(ge=1, le=1024)]
    reward: RewardSpec
    sampling: SamplingParams = SamplingParams()
    max_turns: Annotated[int, Meta(ge=1, le=64)] = 1
    continuation: Continuation | None = None
    issued_policy_version: Version
    issued_at: Timestamp


class Rollout(msgspec.Struct, frozen=True, kw_only=True):
    """What the learner needs of one sample, carried unchanged from generator to learner.

    ``behaviour_logprobs[i]`` is log mu(completion_token_ids[i] | prefix) under the
    distribution actually sampled from (see ``logprob_temperature``).
    """

    rollout_id: Id  # "{group_id}/{sample_index}"
    group_id: Id
    sample_index: Annotated[int, Meta(ge=0)]
    group_size: Annotated[int, Meta(ge=1, le=1024)]
    task_id: Id
    family: Id
    prompt_token_ids: TokenArray
    completion_token_ids: TokenArray
    behaviour_logprobs: LogProbArray
    generated_mask: MaskArray | None = None
    logprob_temperature: Annotated[float, Meta(ge=0.0, le=10.0)] = 1.0
    # The task's domain (rollstream.tasks.domain_of its reward kind: "code", "math"), set by the
    # generator; the learner's per-domain advantage normalisation and loss weights read it. Empty:
    # written before the field (counted as a domain of its own: unweighted, normalised alone).
    domain: Annotated[str, Meta(max_length=64)] = ""
    policy_version_first: Version
    policy_version_last: Version
    issued_policy_version: Version
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        _pack_fields(self, _PACKED_FIELDS)
        if len(self.behaviour_logprobs) != len(self.completion_token_ids):
            raise ValueError(
                f"behaviour_logprobs has {len(self.behaviour_logprobs)} entries "
                f"for {len(self.completion_token_ids)} completion tokens"
            )
        if self.generated_mask is not None and len(self.generated_mask) != len(self.completion_token_ids):
            raise ValueError("generated_mask must have one entry per completion token")


class ActionGenerated(Event, frozen=True, kw_only=True):
    """One sampled completion of a group."""

    rollout: Rollout
    completion_text: Text
    reward: RewardSpec
    max_turns: Annotated[int, Meta(ge=1, le=64)] = 1
    turn: Annotated[int, Meta(ge=1)] = 1
    subtask_index: Annotated[int, Meta(ge=0)] = 0  # a subtask chain: the step this turn works on
    carried_code: Text = ""  # a subtask chain: the code of the steps passed, run before this turn's
    policy_versions: Annotated[list[Version], Meta(max_length=1024)] = []  # episodes: every version used so far
    workspace: Workspace = []  # episodes: the files its earlier turns left, restored before this turn runs
    error: ShortText | None = None  # set when no completion could be made (e.g. prompt too long)
    generator_id: ShortText
    queued_s: Seconds
    generate_s: Seconds
    generated_at: Timestamp


TestOutcome = Literal["passed", "failed", "error", "skipped"]
MAX_TEST_RESULTS = 64  # entries of ExecutionRecord.test_results; the rest are counted
MAX_TEST_MESSAGES = 4096  # characters of their messages together


class TestResult(msgspec.Struct, frozen=True, kw_only=True):
    """One test's result: ``passed``; ``failed`` (its check did not hold: an AssertionError, or the
    judge refused the answer it checked); ``error`` (something else was raised while it ran: the
    completion's exception, a crash); ``skipped`` (the tests skipped it themselves). A failing
    ``assert a <op> b`` carries both sides in ``message`` (the judge's, from plain data)."""

    __test__ = False  # not a pytest class

    index: Annotated[int, Meta(ge=0)]
    outcome: TestOutcome
    error_type: ShortText = ""
    message: ShortText = ""
    duration_s: Seconds = 0.0
    node_id: ShortText = ""  # a pytest file's test (file::name[params]); empty for a statement test


class AnswerVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """How an answer kind's verdict (``math_answer``) was reached: the answer read from the completion, where,
    what it was compared with, what the CAS made of each, and why they matched or not."""

    rule: ShortText  # where the answer was read: boxed, gsm8k, the_answer_is, regex
    extracted: ShortText = ""  # the answer as written (cut at 500 characters; empty: none found)
    gold: ShortText = ""  # the gold answer it was compared with (read from RewardSpec.answer)
    extracted_parsed: ShortText = ""  # what the CAS read the answer as (cut at 500 characters)
    gold_parsed: ShortText = ""
    matched: bool = False
    reason: ShortText = ""


class ExecutionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What happened when a completion ran in a sandbox (or, for an answer kind, was checked)."""

    sandbox_id: ShortText
    exit_code: int | None
    duration_s: Seconds
    error_kind: ErrorKind
    error_message: ShortText = ""
    error_line: int | None = None
    timed_out: bool = False
    oom: bool = False
    tests_passed: Annotated[int, Meta(ge=0)] = 0
    tests_total: Annotated[int, Meta(ge=0)] = 0
    stdout_tail: ShortText = ""
    stderr_tail: ShortText = ""
    # Where the verdict was decided; None: nothing ran, or written before schema version 3,
    # when every verdict was decided in the completion's own process.
    trust: Trust | None = None
    tamper: ShortText = ""  # with error_kind "tamper": what the code did (e.g. "protocol")
    # Tests the tests themselves skipped (@unittest.skip, skipTest): neither passed nor failed,
    # and left out of tests_total's share (docs/executor.md, "Skips").
    tests_skipped: Annotated[int, Meta(ge=0)] = 0
    # What the judge could not guarantee for this execution: the guarantees of the tests that ran
    # in the completion's own process (trust "in_process" or "mixed"; docs/executor.md).
    lost_guarantees: Annotated[list[ShortText], Meta(max_length=16)] = []
    in_process_tests: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=1000)] = []
    # Each test's result, in test order, up to MAX_TEST_RESULTS entries and MAX_TEST_MESSAGES
    # characters of messages (``test_results_omitted`` counts the tests left out); empty when no
    # test ran, or written before per-test results existed.
    test_results: Annotated[list[TestResult], Meta(max_length=MAX_TEST_RESULTS)] = []
    test_results_omitted: Annotated[int, Meta(ge=0)] = 0
    # An answer kind's verdict (math_answer): what was read, compared with what, and why; None for code
    answer_check: AnswerVerdict | None = None

    @property
    def passed(self) -> bool:
        """Ran cleanly and passed every test that ran, at least one (a task without tests: ran
        cleanly; one whose every test the tests skipped verified nothing: not passed)."""
        if self.error_kind != "none":
            return False
        return self.tests_total == 0 or 0 < self.tests_passed == self.tests_total - self.tests_skipped

    @property
    def outcome(self) -> Outcome:
        """The typed outcome of this execution (:func:`outcome_of`)."""
        return outcome_of(self.error_kind, self.passed)

    @property
    def verdict(self) -> str:
        """One word: ``pass``, ``fail`` (ran cleanly, some test failed) or the error kind."""
        if self.error_kind != "none":
            return self.error_kind
        return "pass" if self.passed else "fail"


class Attestation(msgspec.Struct, frozen=True, kw_only=True):
    """What a verdict was decided on, signed by the executor that decided it (rollstream/attest.py):
    the digests of the reward spec and of the code that ran, the sandbox image and runtime, and an
    Ed25519 signature over them with the verdict and its rollout (v2: over ``digests``, one per
    field, so a check names the field that changed). Anyone with the public key of ``key_id`` can
    check it; only the executor's private key can make it."""

    key_id: Id
    spec_sha256: ShortText  # the reward spec's (kind, entry point, tests, setup, program, steps, weights)
    code_sha256: ShortText  # the code extracted from the completion (and carried from a chain's steps)
    image: ShortText  # the sandbox image's id ("sim": no sandbox)
    runtime: ShortText  # the container runtime and the digest of the sandbox's runner source
    signature: Annotated[bytes, Meta(min_length=64, max_length=64)]
    # v2 (rollstream/attest.py): a 16-byte sha256 prefix of each signed field, in the order of that
    # record's field list; the signature is over these. Empty: signed under v1 (older executors)
    digests: Annotated[bytes, Meta(max_length=2048)] = b""


class RewardScored(Event, frozen=True, kw_only=True):
    """The reward of one rollout, with the execution record behind it.

    ``outcome`` is the execution's (:func:`outcome_of`; ``None`` given: derived, as for events
    written before version 5); one that disagrees with the record does not decode. An ``infra``
    outcome is no reward: ``reward`` is 0 and the stream leaves the rollout out of its group.
    """

    rollout: Rollout
    reward: Reward
    components: dict[Id, Finite]
    execution: ExecutionRecord
    executor_id: ShortText
    scored_at: Timestamp
    outcome: Outcome | None = None
    attestation: Attestation | None = None  # None: the executor signs nothing (no key configured)

    def __post_init__(self) -> None:
        derived = self.execution.outcome
        if self.outcome is None:
            msgspec.structs.force_setattr(self, "outcome", derived)
        elif self.outcome != derived:
            raise ValueError(f"outcome {self.outcome!r} does not match the execution ({derived!r})")
        if derived == "infra" and (self.reward != 0.0 or self.components):
            raise ValueError("an infra outcome carries no reward")


class ExcludedRollout(msgspec.Struct, frozen=True, kw_only=True):
    """A rollout its group was resolved without (its outcome was ``infra``: no reward), and why."""

    rollout_id: Id
    sample_index: Annotated[int, Meta(ge=0)]
    outcome: Outcome = "infra"
    reason: ShortText = ""  # the execution's error message (what failed)


class AdvantagedRollout(msgspec.Struct, frozen=True, kw_only=True):
    rollout: Rollout
    reward: Reward
    advantage: Finite
    passed: bool | None = None  # ran cleanly and passed every test (None: written before it was recorded)


class GroupStats(msgspec.Struct, frozen=True, kw_only=True):
    size: Annotated[int, Meta(ge=0)]
    expected_size: Annotated[int, Meta(ge=1)]
    reward_mean: Finite
    reward_std: Annotated[float, Meta(ge=0.0, le=1e9)]
    reward_min: Finite
    reward_max: Finite


class GroupAdvantaged(Event, frozen=True, kw_only=True):
    """A finished group, each rollout with its group-relative advantage."""

    group_id: Id
    task_id: Id
    family: Id
    estimator: Id
    complete: bool  # False when emitted at the deadline with fewer than group_size rollouts
    # Empty only when filtered (every sample left out: "infra")
    rollouts: Annotated[list[AdvantagedRollout], Meta(max_length=1024)]
    stats: GroupStats
    emitted_at: Timestamp
    # Set when the group carries nothing to train on (e.g. "zero_variance": every reward equal,
    # advantages all 0; "infra": too few samples left once those the machinery lost were left
    # out): the learner records and counts it, and trains on it no step.
    filtered: ShortText = ""
    # Rollouts left out of the advantages (outcome "infra"); the stats are over ``rollouts`` only
    excluded: Annotated[list[ExcludedRollout], Meta(max_length=1024)] = []

    def __post_init__(self) -> None:
        if not self.rollouts and not self.filtered:
            raise ValueError("a group with no rollouts must say why (filtered)")


class WeightsPublished(Event, frozen=True, kw_only=True):
    """A new policy version is readable from the weight store."""

    version: Version
    step: Annotated[int, Meta(ge=0)]
    manifest_key: ShortText
    checksum: ShortText  # sha256 of the manifest bytes
    num_bytes: Annotated[int, Meta(ge=0)]
    dtype: ShortText
    published_at: Timestamp


Share = Annotated[float, Meta(ge=0.0, le=1.0)]


class FamilyEval(msgspec.Struct, frozen=True, kw_only=True):
    """One task family's figures in an evaluation (``ALL``: every task evaluated)."""

    family: ShortText
    tasks: Annotated[int, Meta(ge=0)]
    samples: Annotated[int, Meta(ge=0)]
    pass_at: dict[str, Share] = {}  # "1" -> pass@1, "k" -> pass@k (the unbiased estimator, averaged over tasks)
    mean_reward: Reward = 0.0
    with_code: Share | None = None  # samples whose last turn had a code block
    parses: Share | None = None  # ... whose code parsed
    runs: Share | None = None  # ... whose code ran without an error
    pass1_with_code: Share | None = None  # pass@1 among the samples with a code block
    pass1_parsing: Share | None = None  # ... among those whose code parsed
    pass1_running: Share | None = None  # ... among those whose code ran
    ci_low: Share | None = None  # a bootstrap interval of pass@1 over tasks and samples
    ci_high: Share | None = None
    best_before: Share | None = None  # the family's best pass@1 at an earlier version (same scope)
    forgetting: bool = False  # ci_high < best_before


class DomainEval(msgspec.Struct, frozen=True, kw_only=True):
    """One domain's figures in an evaluation (``rollstream.tasks.domain_of``: "code", "math"): pass@1
    over its tasks, its bootstrap interval, and whether it is forgetting (as :class:`FamilyEval`)."""

    domain: ShortText
    tasks: Annotated[int, Meta(ge=0)]
    samples: Annotated[int, Meta(ge=0)]
    pass1: Share | None = None  # averaged over the domain's tasks
    ci_low: Share | None = None  # a bootstrap interval of pass1 over tasks and samples
    ci_high: Share | None = None
    best_before: Share | None = None  # the domain's best pass@1 at an earlier version (same scope)
    forgetting: bool = False  # ci_high < best_before
    rising: bool = False  # ci_low > best_before (a rise beyond the noise)


EvalScope = Literal["live", "final"]


class EvalReported(Event, frozen=True, kw_only=True):
    """The evaluator's verdict on one policy version: held-out pass@k per family (``scope`` "live":
    the fixed live subset; "final": the whole held-out split, at the end of the run), or why the
    version was skipped (``status`` "skipped": the evaluator fell behind, the weights expired, the
    split changed)."""

    version: Version
    step: Annotated[int, Meta(ge=0)]
    scope: EvalScope = "live"
    status: Literal["evaluated", "skipped"] = "evaluated"
    reason: ShortText = ""
    families: list[FamilyEval] = []
    domains: list[DomainEval] = []  # per domain (code, math); defaulted: older reports decode
    samples: Annotated[int, Meta(ge=0)] = 0
    turns: Annotated[int, Meta(ge=1)] = 1
    seed: int = 0
    task_digest: ShortText = ""  # of the task ids evaluated
    heldout_digest: ShortText = ""  # of the run's held-out split (run.json says the same, or nothing is reported)
    duration_s: Seconds = 0.0
    reported_at: Timestamp


GroupFateKind = Literal["trained", "stale", "filtered", "duplicate", "invalid"]
# The one vocabulary of what became of a group (the learner's fates, the stream's drops, the
# progress counters, the metrics, `rollstream run`'s progress line): trained; filtered (the stream
# found nothing to train on, with its reason); dropped with a reason (stale, duplicate, invalid:
# the learner's; incomplete: the stream's, a group that never reached min_group_size).
GroupOutcome = Literal["trained", "filtered", "dropped"]
DropReason = Literal["stale", "duplicate", "invalid", "incomplete"]


def group_outcome(fate: GroupFateKind) -> tuple[GroupOutcome, str]:
    """A fate in the one vocabulary: ``("trained", "")``, ``("filtered", "")`` or ``("dropped", reason)``."""
    if fate in ("trained", "filtered"):
        return fate, ""
    return "dropped", fate


class GroupFate(Event, frozen=True, kw_only=True):
    """What the learner did with one group it consumed: the one record of each group's fate.

    ``trained``: some of its rollouts were in the optimizer step ``step``, which produced policy
    version ``policy_version``; ``stale``: every rollout was older than ``max_staleness``
    allows (``reason`` gives the versions); ``filtered``: the stream flagged it as carrying
    nothing to train on (``reason``, e.g. "zero_variance"); ``duplicate``: this lineage had
    already consumed a group with this id (an upstream redelivery), so this copy was skipped;
    ``invalid``: the model cannot train on it (``reason``, e.g. a token id outside its
    vocabulary); it is also dead-lettered with its bytes.
    ``learner_run`` names the learner process (a resumed learner is a new run continuing the
    checkpoint's lineage at ``step``), so a group retrained after a learner crash shows up once
    per run that trained it.
    """

    group_id: Id
    task_id: Id
    family: Id
    fate: GroupFateKind
    reason: ShortText = ""
    step: Annotated[int, Meta(ge=0)]  # the learner's step count after deciding (the step that trained it)
    policy_version: Version  # the version the step produced (trained), else the learner's version then
    learner_version: Version  # the learner's version when the group was decided (before the step)
    rollouts: Annotated[int, Meta(ge=0)]
    rollouts_trained: Annotated[int, Meta(ge=0)] = 0
    rollouts_stale: Annotated[int, Meta(ge=0)] = 0
    behaviour_versions: Annotated[list[Version], Meta(max_length=1024)] = []  # policy_version_first seen
    learner_run: ShortText
    source_partition: Annotated[int, Meta(ge=0)]  # where on ``advantages`` the group was read
    source_offset: Annotated[int, Meta(ge=0)]
    decided_at: Timestamp
    excluded: Annotated[list[ExcludedRollout], Meta(max_length=1024)] = []  # left out by the stream (infra)


class SandboxLimits(msgspec.Struct, frozen=True, kw_only=True):
    timeout_s: Seconds
    memory_mb: Annotated[int, Meta(ge=0)]
    pids: Annotated[int, Meta(ge=0)]
    cpus: Annotated[float, Meta(ge=0.0, le=1024.0)]
    output_bytes: Annotated[int, Meta(ge=0)]
    tmpfs_mb: Annotated[int, Meta(ge=0)]


class Connection(msgspec.Struct, frozen=True, kw_only=True):
    """One connection an execution made through the egress proxy, allowed or not."""

    host: ShortText
    port: Annotated[int, Meta(ge=0, le=65535)]
    method: ShortText = ""  # CONNECT (HTTPS: its contents are not seen), or the HTTP method
    verdict: Literal["allowed", "denied", "failed"]  # failed: allowed, but the host could not be reached
    reason: ShortText = ""
    sent: Annotated[int, Meta(ge=0)] = 0
    received: Annotated[int, Meta(ge=0)] = 0
    duration_s: Seconds = 0.0


class SandboxAudit(Event, frozen=True, kw_only=True):
    """One execution in a sandbox, for operators."""

    sandbox_id: ShortText
    container_id: ShortText
    rollout_id: ShortText
    code_sha256: ShortText
    limits: SandboxLimits
    duration_s: Seconds
    output_bytes: Annotated[int, Meta(ge=0)]
    verdict: ErrorKind
    violations: Annotated[list[ShortText], Meta(max_length=64)] = []
    recycled: bool = False
    executed_at: Timestamp
    outcome: Outcome | None = None  # the verdict's outcome (None: written before version 5)
    attestation: Attestation | None = None
    connections: Annotated[list[Connection], Meta(max_length=1000)] = []  # through the egress proxy


class DeadLetter(Event, frozen=True, kw_only=True):
    """A record a stage could not use, kept byte for byte with the reason."""

    topic: ShortText
    partition: Annotated[int, Meta(ge=0)]
    offset: Annotated[int, Meta(ge=0)]
    key: bytes | None
    value: bytes | None
    reason: ShortText
    stage: ShortText
    failed_at: Timestamp
