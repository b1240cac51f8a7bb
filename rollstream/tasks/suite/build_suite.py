"""Build the built-in suite: ``python -m rollstream.tasks.suite.build_suite`` rewrites ``<family>.jsonl``.

Reads the task definitions of ``strings_lists_math_conditionals.py``, ``parsing_dicts_recursion_search.py``,
``sets_matrices_time_bits.py`` and ``easiest.py``, runs each
reference solution to compute the expected value of every visible and held-out test, checks
that the wrong solution fails at least one visible test, and writes one TaskSpec per line
(sorted by task id, so the output is deterministic). The tasks of ``judged_kinds.py`` (classes,
printed output, programs, in-place mutation, expected exceptions) come with literal tests;
the suite check runs their references and wrong solutions through the real sandbox. The wrong solutions are
each task's ``wrong_solutions``, which the suite check (tests/rollstream/tasks/test_suite.py) and
``rollstream tasks check`` use.

``--check`` verifies that the files on disk equal what would be written.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec, encode_task
from rollstream.tasks.suite import (
    easiest,
    judged_kinds,
    parsing_dicts_recursion_search,
    sets_matrices_time_bits,
    strings_lists_math_conditionals,
)
from rollstream.tasks.suite.authoring import Def
from rollstream.tasks.suite.judged_kinds import J

SUITE_DIR = Path(__file__).resolve().parent
PROMPT = (
    "Write a Python function `{signature}` that {description}.\n\n"
    "For example, `{call}` should return `{expected}`.\n\n"
    "Return the complete function in a ```python code block."
)


def all_defs() -> list[Def | J]:
    return [*strings_lists_math_conditionals.DEFS, *parsing_dicts_recursion_search.DEFS, *sets_matrices_time_bits.DEFS,
            *easiest.DEFS, *judged_kinds.JUDGED]


def _load(source: str, name: str):
    namespace: dict = {}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - our own reference code
    return namespace[name]


def _call(fn, args: str):
    return eval(f"__fn({args})", {"__fn": fn})  # noqa: S307 - our own argument literals


def _literal(value: object) -> str:
    """``repr``, but sets are written sorted: a set of strings reprs in hash order, which
    changes with PYTHONHASHSEED, and the files must be byte-identical on every build."""
    if isinstance(value, (set, frozenset)) and value:
        return "{" + ", ".join(sorted(map(repr, value))) + "}"
    return repr(value)


def _test(name: str, args: str, expected: object) -> str:
    text = _literal(expected)
    if eval(text) != expected:  # noqa: S307
        raise ValueError(f"{name}({args}): result {text} does not round-trip through repr")
    return f"assert {name}({args}) == {text}"


def _fails(wrong_fn, d: Def, tests: list[tuple[str, object]]) -> bool:
    for args, expected in tests:
        try:
            if _call(wrong_fn, args) != expected:
                return True
        except Exception:  # noqa: BLE001 - any failure of the wrong solution counts
            return True
    return False


def build_task(d: Def) -> tuple[TaskSpec, str]:
    """The TaskSpec of one definition and its wrong solution's source."""
    reference = d.source(d.reference)
    wrong = d.source(d.wrong)
    fn = _load(reference, d.name)
    visible = [(a, _call(fn, a)) for a in d.tests]
    heldout = [(a, _call(fn, a)) for a in d.heldout]
    if not _fails(_load(wrong, d.name), d, visible):
        raise ValueError(f"{d.family}/{d.name}: the wrong solution passes every visible test")
    args, expected = visible[0]
    prompt = PROMPT.format(signature=d.signature, description=d.description,
                           call=f"{d.name}({args})", expected=_literal(expected))
    task = TaskSpec(
        task_id=f"{d.family}/{d.name}",
        family=d.family,
        prompt=prompt,
        reward=RewardSpec(entry_point=d.name, tests=[_test(d.name, a, e) for a, e in visible], timeout_s=5.0),
        heldout_tests=[_test(d.name, a, e) for a, e in heldout],
        reference_solution=reference,
        difficulty=d.difficulty,
        wrong_solutions=[wrong],
    )
    return task, wrong


def build_judged(j: J) -> tuple[TaskSpec, str]:
    """The TaskSpec of one ``judged_kinds`` definition and its wrong solution's source."""
    task = TaskSpec(
        task_id=f"{j.family}/{j.name}",
        family=j.family,
        prompt=j.full_prompt(),
        reward=RewardSpec(entry_point=j.entry_point, tests=list(j.tests), program=j.kind == "program",
                          timeout_s=5.0),
        heldout_tests=list(j.heldout),
        reference_solution=j.reference,
        difficulty=j.difficulty,
        wrong_solutions=[j.wrong],
    )
    return task, j.wrong


def render(defs: list[Def | J]) -> dict[str, bytes]:
    """File name -> content of every suite file."""
    by_family: dict[str, list[TaskSpec]] = defaultdict(list)
    seen = set()
    errors = []
    for d in defs:
        try:
            task, _ = build_judged(d) if isinstance(d, J) else build_task(d)
        except Exception as exc:  # noqa: BLE001 - report every bad definition at once
            errors.append(f"{d.family}/{d.name}: {exc!r}")
            continue
        if task.task_id in seen:
            raise ValueError(f"duplicate task id {task.task_id}")
        seen.add(task.task_id)
        by_family[d.family].append(task)
    if errors:
        raise ValueError("bad suite definitions:\n" + "\n".join(errors))
    files = {
        f"{family}.jsonl": b"".join(encode_task(t) + b"\n" for t in sorted(tasks, key=lambda t: t.task_id))
        for family, tasks in sorted(by_family.items())
    }
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the files on disk are stale")
    args = parser.parse_args(argv)
    files = render(all_defs())
    stale = [n for n, c in files.items() if not (SUITE_DIR / n).exists() or (SUITE_DIR / n).read_bytes() != c]
    if args.check:
        print("stale: " + ", ".join(stale) if stale else "suite is up to date")
        return 1 if stale else 0
    for name, content in files.items():
        (SUITE_DIR / name).write_bytes(content)
    counts = {n: c.count(b"\n") for n, c in files.items()}
    print(f"{sum(counts.values())} tasks in {len(counts)} families: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
