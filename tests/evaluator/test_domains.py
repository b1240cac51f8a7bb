"""Code and math in one evaluation (issue 55, item 5): a task's domain (rollstream.tasks.domain_of),
pass@1 per domain with its bootstrap interval, and the forgetting alert by domain, on a scripted
sequence of evaluation rounds (evaluator/report.py), and what the evaluator makes of a round's
report: the per-domain gauges and the warning naming both domains (evaluator/stage.py)."""

from __future__ import annotations

import logging
import random

import pytest

from rollstream.evaluator.play import SampleResult
from rollstream.evaluator.report import best_after, bootstrap_pass1, domains, trade_offs
from rollstream.evaluator.stage import Evaluator, EvaluatorMetrics
from rollstream.metrics import StageMetrics
from rollstream.schemas import DomainEval, EvalReported, FamilyEval, TaskSpec
from rollstream.tasks import DOMAINS, domain_of
from rollstream.tasks.sources import load_tasks

pytestmark = pytest.mark.unit


def test_the_domain_is_math_for_math_answer_and_code_for_every_other_kind() -> None:
    assert domain_of("math_answer") == "math"
    assert {domain_of(kind) for kind in ("python_tests", "python_pytest", "anything_else")} == {"code"}
    assert set(DOMAINS) == {"code", "math"}
    # A family named "math" of code tasks is code: the kind decides, not the family's name.
    code_math = TaskSpec(task_id="math/gcd", family="math", prompt="Write gcd(a, b).")
    assert domain_of(code_math.reward.kind) == "code"
    [arithmetic, *_] = load_tasks(["suite:math"])
    assert domain_of(arithmetic.reward.kind) == "math"


def scripted_round(rates: dict[str, float], seed: int, tasks: int = 12, samples: int = 4) -> list[SampleResult]:
    """One evaluation round of a scripted policy: each sample of each domain's tasks passes with that
    domain's rate (seeded, so a round is the same every run)."""
    rng = random.Random(seed)
    out = []
    for domain, rate in rates.items():
        for t in range(tasks):
            for s in range(samples):
                passed = rng.random() < rate
                out.append(SampleResult(f"{domain}/t{t}", f"{domain}_family", s, passed, 1.0 if passed else 0.0,
                                        "none", "stop", 5, domain=domain))
    return out


def play(rounds: list[dict[str, float]], **kw) -> list[dict[str, dict]]:
    """The evaluator's sequence: each round's rows against the best of the rounds before it."""
    best: dict[str, float] = {}
    rows = []
    for i, rates in enumerate(rounds):
        row = domains(scripted_round(rates, seed=i, **kw), best)
        best = best_after(best, row)
        rows.append(row)
    return rows


def test_one_domain_dropping_while_the_other_rises_fires_the_alert() -> None:
    rows = play([{"code": 0.6, "math": 0.1}, {"code": 0.65, "math": 0.2}, {"code": 0.1, "math": 0.6}])
    first, second, third = rows
    assert first["code"]["best_before"] is None and not first["code"]["forgetting"] and not first["code"]["rising"]
    assert not second["code"]["forgetting"] and not second["math"]["forgetting"]
    assert trade_offs(first) == trade_offs(second) == []
    assert third["code"]["forgetting"] and third["code"]["ci_high"] < third["code"]["best_before"]
    assert third["math"]["rising"] and third["math"]["ci_low"] > third["math"]["best_before"]
    assert not third["math"]["forgetting"]
    assert trade_offs(third) == [("code", "math")]
    for row in third.values():
        assert row["tasks"] == 12 and row["samples"] == 48 and row["ci_low"] <= row["pass1"] <= row["ci_high"]


def test_a_drop_with_nothing_rising_is_forgetting_but_no_trade_off() -> None:
    *_, last = play([{"code": 0.6, "math": 0.5}, {"code": 0.1, "math": 0.5}])
    assert last["code"]["forgetting"] and not last["math"]["forgetting"]
    assert trade_offs(last) == []  # math is not above its best beyond the noise: the warning names only code


def test_noise_inside_the_interval_raises_no_flag() -> None:
    # The same policy every round (code 0.5, math 0.3) on a small live subset: the rounds' pass@1
    # differ by chance, and the best earlier one always lies inside the later intervals.
    rows = play([{"code": 0.5, "math": 0.3}] * 6, tasks=4, samples=2)
    assert len({round(r["code"]["pass1"], 3) for r in rows}) > 1  # the rounds do differ
    assert not any(r[d]["forgetting"] or r[d]["rising"] for r in rows for d in r)
    assert all(trade_offs(r) == [] for r in rows)


def test_infra_samples_count_in_no_domain_and_the_family_figures_keep_their_all() -> None:
    results = scripted_round({"code": 0.5, "math": 0.5}, seed=0, tasks=2, samples=2)
    lost = SampleResult("math/lost", "math_family", 0, False, 0.0, "infra", "stop", 5, domain="math")
    row = domains([*results, lost], {})
    assert row["math"]["tasks"] == 2 and row["math"]["samples"] == 4
    assert set(bootstrap_pass1(results, by="domain")) == {"code", "math"}
    assert "ALL" in bootstrap_pass1(results)  # by family, as before


class _Store:
    pass


def evaluator(metrics: StageMetrics) -> Evaluator:
    from rollstream.config import Config

    return Evaluator(Config(), plan=None, store=_Store(), backend=None, pool=None, producer=None, redis=None,
                     metrics=EvaluatorMetrics(metrics), references=object())


def test_the_evaluator_publishes_domain_gauges_and_warns_naming_both_domains(caplog) -> None:
    metrics = StageMetrics("evaluator")
    own = evaluator(metrics)
    rows = play([{"code": 0.6, "math": 0.1}, {"code": 0.1, "math": 0.6}])[-1]
    event = EvalReported(version=4, step=4, families=[FamilyEval(family="ALL", tasks=24, samples=96)],
                         domains=[DomainEval(domain=d, **row) for d, row in rows.items()], reported_at=1.0)
    with caplog.at_level(logging.WARNING, logger="rollstream.evaluator.stage"):
        own.observe(event)
    registry = metrics.registry
    assert registry.get_sample_value("rollstream_evaluator_domain_forgetting", {"domain": "code"}) == 1.0
    assert registry.get_sample_value("rollstream_evaluator_domain_forgetting", {"domain": "math"}) == 0.0
    assert registry.get_sample_value("rollstream_evaluator_domain_heldout_pass1",
                                     {"domain": "math", "scope": "live"}) == pytest.approx(rows["math"]["pass1"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("domain code is forgetting" in w and "domain math rose above its best" in w for w in warnings), warnings
