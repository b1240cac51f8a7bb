"""``bench/executor.py --math``: its percentile, the mix of completions it scores and their expected
verdicts, checked through the real ``math_answer`` kind (math-verify in MathPool's worker processes; no
broker, Redis or Docker: unit)."""

from __future__ import annotations

import asyncio
from collections import Counter
from fractions import Fraction

import pytest

from bench.executor import _decimal, math_mix, percentile
from rollstream.tasks.sources import load_tasks

pytestmark = pytest.mark.unit


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # order of the input does not matter
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_exact_decimals_only() -> None:
    assert _decimal(Fraction(3, 4)) == "0.75"
    assert _decimal(Fraction(-1, 8)) == "-0.125"
    assert _decimal(Fraction(9, 20)) == "0.45"
    assert _decimal(Fraction(72)) == "72.0"
    assert _decimal(Fraction(17, 21)) is None
    assert _decimal(Fraction(1, 6)) is None


def test_the_mix_covers_every_task_and_its_forms() -> None:
    tasks = load_tasks(["suite:math"])
    mix = math_mix(tasks)
    variants = Counter(variant for _, variant, _, _, _ in mix)
    n = len(tasks)
    for variant in ("reference", "wrong", "the_answer_is", "no_box", "hedge"):
        assert variants[variant] == n, variant
    assert variants["decimal"] + variants["decimal_rounded"] == n and variants["decimal_rounded"] > 0
    fractions = sum(1 for t in tasks if "/" in t.reward.answer)
    assert variants["frac"] == variants["dfrac"] == fractions > 0
    assert variants["assignment"] == sum(1 for t in tasks if t.family == "linear_equations") > 0
    expected = {"reference": 1.0, "decimal": 1.0, "frac": 1.0, "dfrac": 1.0, "thousands": 1.0, "assignment": 1.0,
                "the_answer_is": 1.0, "wrong": 0.0, "decimal_rounded": 0.0, "no_box": 0.0, "hedge": 0.0}
    assert set(variants) == set(expected)
    for task_id, variant, spec, text, verdict in mix:
        assert verdict == expected[variant], (task_id, variant)
        assert spec.answer_format == ("the_answer_is" if variant == "the_answer_is" else "boxed")
        assert ("\\boxed{" in text) == (variant not in ("no_box", "the_answer_is")), (task_id, variant, text)


async def test_every_expected_verdict_is_the_kinds() -> None:
    from rollstream.consumers.executor.answers import MathAnswer, MathPool

    mix = math_mix(load_tasks(["suite:math"]))
    kind = MathAnswer(MathPool(2))
    try:
        scored = await asyncio.gather(*(kind.check(spec, text) for _, _, spec, text, _ in mix))
    finally:
        kind.close()
    wrong = [(task_id, variant, text[-60:], result.components, result.execution.answer_check.reason)
             for (task_id, variant, _, text, expected), result in zip(mix, scored)
             if result.components.get("answer") != expected]
    assert not wrong, wrong[:10]
