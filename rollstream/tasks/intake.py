"""Task intake: the report of every task's checks, and what the sampler does with it.

``rollstream tasks check SOURCE ...`` (cli/intake.py) runs the checks that need the sandbox
(reference and wrong solutions, mutants) and the ones here that do not (duplicates,
contamination, personal data: :func:`static_checks`), and writes an :class:`IntakeReport`: one
:class:`TaskCheck` per task, keyed by the task's :func:`digest` (its whole TaskSpec, so an
edited task is unchecked again). The sampler never drives a sandbox: at load time it reads the
report and, by ``intake.mode``, warns about or quarantines (:func:`apply_intake`) every task
whose check failed or that was never checked, each with its reasons.

Reasons a task fails (``TaskCheck.reasons``): ``no_reference``, ``reference_fails``,
``reference_fails_heldout``, ``wrong_solution_passes``, ``weak_tests`` (mutation score below
``intake.min_mutation_score``), ``all_skipped`` (the tests skip every test themselves: the task
verifies nothing), ``params_from_completion`` (a pytest file parametrizes over names the completion
defines: the completion chooses the tests it is scored by; :func:`completion_parameters`),
``contaminated``, ``personal_data``, ``answer_does_not_parse`` (a ``math_answer`` task's gold answer
is empty, over the executor's bounds, a placeholder such as ``proof``, or not read by the CAS: no
completion can match it; such a task runs nothing, so it needs no reference, and a reference it has,
a solution, must reach the same answer). A task whose reference passes some tests
only in process runs them there under ``trust = "auto"``: not a reason (the task chose ``auto``),
but its check lists those tests and the guarantees they lose. Duplicates are reported
(``duplicates``, and the report's clusters) and kept whole on one side of the held-out split;
they are not a reason on their own.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from rollstream.config import Config, IntakeConfig
from rollstream.errors import ConfigError
from rollstream.schemas.tasks import TaskSpec, encode_task
from rollstream.tasks import contamination, dedup, pii
from rollstream.tasks.contamination import Overlap
from rollstream.tasks.dedup import Cluster

REPORT_VERSION = 2  # 2: trivial programs (a report of version 1 is checked again)
REASONS = ("no_reference", "reference_fails", "reference_fails_heldout", "wrong_solution_passes", "weak_tests",
           "all_skipped", "params_from_completion", "contaminated", "personal_data", "answer_does_not_parse")


class Survivor(msgspec.Struct, frozen=True, kw_only=True):
    """A mutant of the reference that passed every visible test."""

    operator: str
    line: int
    change: str
    source: str
    possibly_equivalent: bool  # agreed with the reference on every varied input
    tells_apart: str = ""  # an input on which it differs from the reference (a test to add)


class TrivialSurvivor(msgspec.Struct, frozen=True, kw_only=True):
    """A trivial program (rollstream/tasks/trivial.py) that passed every visible test."""

    name: str  # what it does: "return argument 0 (the identity)", "return 3", ...
    source: str
    tells_apart: str = ""  # an input on which it differs from the reference (a test to add)


class PersonalData(msgspec.Struct, frozen=True, kw_only=True):
    where: str  # prompt | tests
    kind: str  # pii.KINDS
    text: str


class TaskCheck(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    family: str
    digest: str
    reasons: list[str] = []  # why it fails intake (empty: it passes)
    reference_passes: bool | None = None  # None: no reference (or not run)
    heldout_passes: bool | None = None  # None: no held-out tests
    reference_message: str = ""
    # The judge's view of the reference (consumers/executor/reference.py): every test skipped by the
    # tests themselves (the task verifies nothing), and the tests that run in the completion's own
    # process under trust = "auto" because the reference fails them under the judge, with the
    # guarantees those tests lose (ExecutionRecord.lost_guarantees).
    all_skipped: bool = False
    in_process_tests: list[int] = []
    lost_guarantees: list[str] = []
    # The tests the judge cannot judge without the reference: the reference fails them under the
    # strictest reading, the one its spec gets without ``reference`` (docs/executor.md, "Tasks
    # without a reference"); the first one's error.
    needs_reference: list[int] = []
    needs_reference_message: str = ""
    # pytest files whose tests are collected from the completion's names (a parametrize over its
    # data): "file <index>: <names>" (completion_parameters)
    params_from_completion: list[str] = []
    wrong_solutions: int = 0
    wrong_passing: list[int] = []  # indices of wrong solutions that passed every visible test
    mutants_total: int = 0  # every mutant the reference has
    mutants_run: int = 0
    mutants_killed: int = 0
    possibly_equivalent: int = 0
    mutation_score: float | None = None  # killed / (run - possibly equivalent)
    survivors: list[Survivor] = []
    trivial_run: int = 0  # trivial programs tried (decided without a sandbox or run in one)
    # those that passed every visible test and differ from the reference on some varied input
    # (one that agrees everywhere is the task itself: not a finding)
    trivial_passing: list[TrivialSurvivor] = []
    duplicates: list[str] = []  # the other members of its duplicate cluster
    contamination: list[Overlap] = []
    personal_data: list[PersonalData] = []
    # A math_answer task's gold answer as the executor's CAS reads it (None: not such a task); why not
    answer_parses: bool | None = None
    answer_message: str = ""

    @property
    def passed(self) -> bool:
        return not self.reasons


class IntakeReport(msgspec.Struct, kw_only=True):
    version: int = REPORT_VERSION
    tasks: dict[str, TaskCheck] = {}  # digest -> check
    clusters: list[Cluster] = []  # of the last check's tasks


def digest(task: TaskSpec) -> str:
    """What identifies a task's content: a hash of its whole spec."""
    return hashlib.sha256(encode_task(task)).hexdigest()[:32]


def report_path(config: Config) -> Path:
    return Path(config.intake.report or os.path.join(config.infra.state_dir, "intake.json"))


def load_report(path: Path) -> IntakeReport | None:
    """The report at ``path``; None when there is none. ConfigError when it cannot be read."""
    if not path.exists():
        return None
    try:
        report = msgspec.json.decode(path.read_bytes(), type=IntakeReport)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"intake report {path}: {exc}; run `rollstream tasks check` again") from exc
    return report if report.version == REPORT_VERSION else IntakeReport()


def save_report(path: Path, checks: Sequence[TaskCheck], clusters: Sequence[Cluster]) -> IntakeReport:
    """Merge ``checks`` into the report at ``path`` (by digest) and write it atomically."""
    report = load_report(path) or IntakeReport()
    report.tasks.update({c.digest: c for c in checks})
    report.clusters = list(clusters)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=1))
    os.replace(temporary, path)
    return report


def reasons_of(check: TaskCheck, config: IntakeConfig) -> list[str]:
    """The reasons ``check`` fails intake (in REASONS order)."""
    reasons = []
    if check.reference_passes is None:
        if check.answer_parses is None:  # a math task runs nothing: it needs no reference
            reasons.append("no_reference")
    elif not check.reference_passes:
        reasons.append("reference_fails")
    if check.heldout_passes is False:
        reasons.append("reference_fails_heldout")
    if check.wrong_passing:
        reasons.append("wrong_solution_passes")
    if (check.mutation_score is not None and check.mutation_score < config.min_mutation_score) or check.trivial_passing:
        reasons.append("weak_tests")
    if check.all_skipped:
        reasons.append("all_skipped")
    if check.params_from_completion:
        reasons.append("params_from_completion")
    if check.contamination:
        reasons.append("contaminated")
    if check.personal_data:
        reasons.append("personal_data")
    if check.answer_parses is False:
        reasons.append("answer_does_not_parse")
    return reasons


PARAMETRIZING = ("parametrize", "fixture")  # pytest.mark.parametrize(names, values), pytest.fixture(params=...)


def completion_parameters(kind: str, setup: str, tests: Sequence[str]) -> list[str]:
    """The pytest files (``python_pytest``) whose collected tests depend on the completion: a
    ``parametrize``'s values or a fixture's ``params`` that read a name the tests take from the
    completion (``from solution import CASES``, ``solution.CASES``, or a name neither the file, the
    task's setup nor the builtins bind). The completion then chooses how many tests there are and
    what they check; with a reference the executor holds each file to the count the reference
    collected (runtime/pytests.py), but the values stay the completion's. One entry per such file:
    ``"file <index>: <names>"``."""
    if kind != "python_pytest":
        return []
    try:
        provided = {name for node in ast.walk(ast.parse(setup)) for name in _bound(node)}
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        provided = set()
    found = []
    for index, source in enumerate(tests):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue  # the executor reports the broken file
        own = provided | set(dir(builtins)) | {name for node in ast.walk(tree) for name in _bound(node)}
        modules = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for a in node.names if a.name == "solution"}
        taken = {a.asname or a.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module == "solution" and not node.level for a in node.names}
        names = set()
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _callee(node.func) in PARAMETRIZING):
                continue
            values = node.args[1:] if _callee(node.func) == "parametrize" else []
            values += [k.value for k in node.keywords if k.arg in ("argvalues", "params")]
            for value in values:
                for part in ast.walk(value):
                    if isinstance(part, ast.Name) and isinstance(part.ctx, ast.Load) and (
                            part.id in taken or part.id not in own):
                        names.add(part.id)
                    elif (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name)
                          and part.value.id in modules):
                        names.add(f"{part.value.id}.{part.attr}")
        if names:
            found.append(f"file {index}: {', '.join(sorted(names)[:10])}")
    return found


def _callee(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _bound(node: ast.AST) -> list[str]:
    """The names ``node`` binds (other than a ``from solution import``: those are the completion's)."""
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return [node.id]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Import):
        return [(a.asname or a.name).partition(".")[0] for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module != "solution":
        return [a.asname or a.name for a in node.names]
    if isinstance(node, ast.arg):
        return [node.arg]
    return []


def personal_data(task: TaskSpec) -> list[PersonalData]:
    """Personal data and secrets in the task's prompt and tests."""
    found = []
    for where, text in (("prompt", dedup.prompt_text(task)),
                        ("tests", "\n".join([task.reward.setup, *task.reward.tests, *task.heldout_tests]))):
        found += [PersonalData(where=where, kind=f.kind, text=f.text[:200]) for f in pii.find(text)]
    return found


class StaticChecks(msgspec.Struct, frozen=True, kw_only=True):
    clusters: list[Cluster]
    duplicates: dict[str, list[str]]  # task id -> the other members of its cluster
    contamination: dict[str, list[Overlap]]  # task id -> overlaps (training tasks only)
    personal_data: dict[str, list[PersonalData]]
    held_out: list[str]  # the held-out split's task ids (the evaluation side, not checked for contamination)


def static_checks(tasks: Sequence[TaskSpec], eval_tasks: Sequence[TaskSpec], held_out: Sequence[TaskSpec],
                  config: IntakeConfig) -> StaticChecks:
    """Duplicates among ``tasks``, contamination of the training tasks (``tasks`` less
    ``held_out``) by ``held_out`` and ``eval_tasks``, personal data in every task."""
    clusters = dedup.duplicate_clusters(tasks, config.near_duplicate_threshold)
    duplicates = {m: [o for o in c.members if o != m] for c in clusters for m in c.members}
    held_ids = {t.task_id for t in held_out}
    train = [t for t in tasks if t.task_id not in held_ids]
    evaluation = list({t.task_id: t for t in [*held_out, *eval_tasks]}.values())
    index = contamination.EvalIndex(train, evaluation, config.contamination_ngram)
    overlaps = {t.task_id: found for t in train if (found := index.overlaps(t, config.contamination_threshold))}
    found_pii = {t.task_id: found for t in tasks if (found := personal_data(t))}
    return StaticChecks(clusters=clusters, duplicates=duplicates, contamination=overlaps, personal_data=found_pii,
                        held_out=sorted(held_ids))


class Quarantined(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    family: str
    reasons: list[str]


def apply_intake(tasks: Sequence[TaskSpec], report: IntakeReport | None, config: IntakeConfig
                 ) -> tuple[list[TaskSpec], list[Quarantined]]:
    """(the tasks to train on, the tasks that fail intake with their reasons). ``off``: every task,
    nothing reported; ``warn``: every task, the failing ones reported; ``enforce``: the failing ones
    (and the ones the report does not know: ``unchecked``) quarantined."""
    if config.mode == "off":
        return list(tasks), []
    checks = report.tasks if report is not None else {}
    failing = []
    keep = []
    for task in tasks:
        check = checks.get(digest(task))
        reasons = ["unchecked"] if check is None else reasons_of(check, config)
        if reasons:
            failing.append(Quarantined(task_id=task.task_id, family=task.family, reasons=reasons))
        if not reasons or config.mode == "warn":
            keep.append(task)
    return keep, failing
