"""The evaluator's figures (evaluator/report.py), pure: format apart from correctness, the
bootstrap interval, the forgetting flag, the task digest, and which versions get evaluated."""

from __future__ import annotations

import pytest

from rollstream.config import EvalConfig
from rollstream.evaluator.play import SampleResult
from rollstream.evaluator.report import bootstrap_pass1, forgetting, summarize, task_digest

pytestmark = pytest.mark.unit


def sample(task: str, family: str, index: int, passed: bool, **flags) -> SampleResult:
    return SampleResult(task, family, index, passed, 1.0 if passed else 0.0, "none", "stop", 5, **flags)


def test_format_is_told_apart_from_correctness() -> None:
    results = [sample("a/1", "a", 0, True), sample("a/1", "a", 1, False, has_code=False, parses=False, ran=False),
               sample("a/2", "a", 0, False, ran=False), sample("a/2", "a", 1, False, parses=False, ran=False)]
    row = summarize(results, (1,))["a"]
    assert row["pass@1"] == 0.25 and row["with_code"] == 0.75 and row["parses"] == 0.5 and row["runs"] == 0.25
    assert row["pass@1|code"] == pytest.approx(1 / 3) and row["pass@1|parses"] == 0.5 and row["pass@1|runs"] == 1.0


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_tasks() -> None:
    few = [sample(f"t{i}", "f", s, (i + s) % 2 == 0) for i in range(4) for s in range(2)]
    many = [sample(f"t{i}", "f", s, (i + s) % 2 == 0) for i in range(80) for s in range(2)]
    low_few, high_few = bootstrap_pass1(few)["f"]
    low_many, high_many = bootstrap_pass1(many)["f"]
    assert low_few <= 0.5 <= high_few and low_many <= 0.5 <= high_many
    assert high_many - low_many < high_few - low_few
    assert bootstrap_pass1(few) == bootstrap_pass1(few)  # seeded: the same figures every time


def test_forgetting_turns_on_for_a_real_drop_and_stays_off_on_noise() -> None:
    best = {"f": 0.8}
    noisy = [sample(f"t{i}", "f", s, passed) for i, s, passed in
             [(0, 0, True), (0, 1, False), (1, 0, True), (1, 1, True), (2, 0, False), (2, 1, True)]]  # 0.67 on 3 tasks
    dropped = [sample(f"t{i}", "f", s, False) for i in range(12) for s in range(2)]  # 0.0 on 12 tasks
    assert forgetting(bootstrap_pass1(noisy), best) == {"f": False, "ALL": False}
    assert forgetting(bootstrap_pass1(dropped), best)["f"] is True
    assert forgetting(bootstrap_pass1(dropped), {}) == {"f": False, "ALL": False}  # no earlier best: nothing lost


def test_the_task_digest_is_a_set_digest() -> None:
    assert task_digest(["b", "a", "a"]) == task_digest(["a", "b"]) != task_digest(["a"])


def test_which_versions_get_evaluated() -> None:
    options = EvalConfig(every_versions=3)
    assert [v for v in range(12) if options.evaluates(v, 10)] == [3, 6, 9, 10]
    assert not EvalConfig().evaluates(4, 10)  # every_versions 0: no evaluator
