"""The built-in math suite (source ``suite:math``): up to date, well formed, split per family, and every
task's reference scores 1.0 and an off-by-one answer 0 through the real ``math_answer`` kind (math-verify
in the executor's worker processes; no broker, Redis or Docker: unit)."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from fractions import Fraction

import pytest

from rollstream.errors import ConfigError
from rollstream.tasks.dedup import duplicate_clusters
from rollstream.tasks.mathsuite import build
from rollstream.tasks.sources import MATH_SUITE_DIR, builtin_tasks, load_tasks, math_suite_tasks, split_tasks

pytestmark = pytest.mark.unit

FAMILIES = {"arithmetic", "fractions", "linear_equations", "combinatorics", "number_theory", "sequences"}
GOLD = re.compile(r"-?[0-9]+(/[0-9]+)?")


def test_math_suite_files_are_up_to_date() -> None:
    files = build.render()
    assert sorted(files) == sorted(p.name for p in MATH_SUITE_DIR.glob("*.jsonl"))
    for name, content in files.items():
        assert (MATH_SUITE_DIR / name).read_bytes() == content, \
            f"{name} is stale: run python -m rollstream.tasks.mathsuite.build"
    assert build.render() == files  # the same on every build


def test_math_suite_size_families_difficulties_and_answers() -> None:
    tasks = math_suite_tasks()
    families = Counter(t.family for t in tasks)
    assert len(tasks) >= 150 and set(families) == FAMILIES and min(families.values()) >= 25, families
    for family in FAMILIES:
        spread = Counter(t.difficulty for t in tasks if t.family == family)
        assert set(spread) == {1, 2, 3} and spread[1] >= 9, (family, spread)
    assert len({t.prompt for t in tasks}) == len(tasks)
    for task in tasks:
        gold = task.reward.answer
        assert task.reward.kind == "math_answer" and task.reward.answer_format == "boxed"
        assert task.task_id.startswith(f"{task.family}/") and "\\boxed{}" in task.prompt
        assert GOLD.fullmatch(gold), gold
        if "/" in gold:  # a fraction in lowest terms, never a whole number written as one
            value = Fraction(gold)
            assert f"{value.numerator}/{value.denominator}" == gold and value.denominator > 1
        assert task.reference_solution.endswith(f"\\boxed{{{gold}}}$.")
        assert len(task.wrong_solutions) == 1 and f"\\boxed{{{gold}}}" not in task.wrong_solutions[0]
    assert not FAMILIES & {t.family for t in builtin_tasks()}  # mixing keeps the domains' families apart
    assert all(t.reward.kind == "python_tests" for t in builtin_tasks())  # builtin is still the code suite


def test_suite_sources() -> None:
    assert load_tasks(["suite:code"]) == load_tasks(["builtin"])
    assert load_tasks(["suite:math"]) == sorted(math_suite_tasks(), key=lambda t: t.task_id)
    both = load_tasks(["builtin", "suite:math"])
    assert len(both) == len(builtin_tasks()) + len(math_suite_tasks())
    for spec in ("suite:nope", "suite"):
        with pytest.raises(ConfigError, match="suite:code, suite:math"):
            load_tasks([spec])
    with pytest.raises(ConfigError, match="already came from"):
        load_tasks(["builtin", "suite:code"])


@pytest.mark.parametrize("specs", [["suite:math"], ["builtin", "suite:math"]])
def test_the_held_out_split_works_per_family(specs: list[str]) -> None:
    tasks = load_tasks(specs)
    trained, held = split_tasks(tasks, 0.2, seed=0)
    assert len(trained) + len(held) == len(tasks)
    sizes = Counter(t.family for t in tasks)
    held_by_family = Counter(t.family for t in held)
    for family in FAMILIES:
        assert sizes[family] // 5 <= held_by_family[family] < sizes[family] // 2, (family, held_by_family)
    held_ids = {t.task_id for t in held}
    for cluster in duplicate_clusters(tasks):  # twins (same template, near-identical text) stay on one side
        assert len({m in held_ids for m in cluster.members}) == 1, cluster.members
    assert split_tasks(tasks, 0.2, seed=0) == (trained, held)


async def test_every_reference_scores_one_and_an_off_by_one_answer_zero() -> None:
    from rollstream.consumers.executor.answers import MathAnswer, MathPool

    tasks = math_suite_tasks()
    kind = MathAnswer(MathPool(4))
    try:
        def minus_one(gold: str) -> str:  # n - 1, or a/b with the numerator one smaller
            value = Fraction(gold)
            wrong = f"{value.numerator - 1}" + (f"/{value.denominator}" if value.denominator > 1 else "")
            return f"The answer is $\\boxed{{{wrong}}}$."

        jobs = [(t, "reference", t.reference_solution) for t in tasks]
        jobs += [(t, "wrong", t.wrong_solutions[0]) for t in tasks]
        jobs += [(t, "minus_one", minus_one(t.reward.answer)) for t in tasks]
        scored = await asyncio.gather(*(kind.check(t.reward, text) for t, _, text in jobs))
    finally:
        kind.close()
    bad = []
    for (task, what, text), result in zip(jobs, scored):
        expected = 1.0 if what == "reference" else 0.0
        if result.reward != expected or result.components.get("format") != 1.0:
            bad.append((task.task_id, what, text[-40:], result.reward, result.execution.answer_check))
    assert not bad, bad[:10]
    assert len(scored) == 3 * len(tasks)
