"""The mixture is pure: family frequencies follow the weights, plans are deterministic."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rollstream.producers.mixture import (
    AdaptiveStats,
    apportion,
    epoch_plan,
    family_probabilities,
    informative,
)
from rollstream.tasks.sources import load_tasks

pytestmark = pytest.mark.unit

FAMILIES = ["a"] * 10 + ["b"] * 30 + ["c"] * 60


def test_family_probabilities_weights_and_temperature() -> None:
    sizes = Counter(FAMILIES)
    assert family_probabilities(sizes, {}, 0.0) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert family_probabilities(sizes, {"a": 2.0, "c": 0.0}, 0.0) == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    assert family_probabilities(sizes, {}, 1.0) == pytest.approx({"a": 0.1, "b": 0.3, "c": 0.6})
    hot = family_probabilities(sizes, {}, 1000.0)
    assert max(hot.values()) - min(hot.values()) < 0.01
    with pytest.raises(ValueError):
        family_probabilities(sizes, {"a": 0, "b": 0, "c": 0}, 0.0)


@pytest.mark.parametrize("weights,temperature", [({}, 0.0), ({"a": 5.0, "b": 1.0, "c": 0.5}, 0.0), ({}, 1.0),
                                                 ({"c": 0.0}, 2.0)])
def test_issued_family_frequencies_match_weights(weights: dict, temperature: float) -> None:
    """Over N = 20 epochs x 100 = 2000 draws every family's frequency is within 0.01 of its probability."""
    probs = family_probabilities(Counter(FAMILIES), weights, temperature)
    draws = [FAMILIES[i] for epoch in range(20) for i in epoch_plan(FAMILIES, probs, seed=3, epoch=epoch)]
    freq = Counter(draws)
    for family in ("a", "b", "c"):
        assert abs(freq[family] / len(draws) - probs.get(family, 0.0)) <= 0.01, (family, freq)


def test_builtin_suite_frequencies_over_prefixes() -> None:
    """Even a partial epoch (first 100 positions) is close to the weights: |error| <= 0.03 per family."""
    tasks = load_tasks(["builtin"])
    families = [t.family for t in tasks]
    probs = family_probabilities(Counter(families), {"math": 3.0}, 0.0)
    for epoch in range(5):
        prefix = Counter(families[i] for i in epoch_plan(families, probs, seed=0, epoch=epoch)[:100])
        for family, p in probs.items():
            assert abs(prefix[family] / 100 - p) <= 0.03, (epoch, family, prefix[family])


def test_plan_is_deterministic_and_epoch_dependent() -> None:
    probs = family_probabilities(Counter(FAMILIES), {}, 1.0)
    one = epoch_plan(FAMILIES, probs, seed=1, epoch=4)
    assert one == epoch_plan(FAMILIES, probs, seed=1, epoch=4)
    assert one != epoch_plan(FAMILIES, probs, seed=1, epoch=5)
    assert one != epoch_plan(FAMILIES, probs, seed=2, epoch=4)
    assert sorted(one) == list(range(len(FAMILIES)))  # temperature 1, no feedback: each task once


def test_adaptive_prefers_informative_tasks() -> None:
    families = ["a"] * 10
    probs = family_probabilities(Counter(families), {}, 0.0)
    scores = {i: (1.0 if i < 5 else 0.0) for i in range(10)}
    counts = Counter(i for e in range(200) for i in epoch_plan(families, probs, seed=0, epoch=e,
                                                              scores=scores, strength=0.5))
    informative_share = sum(counts[i] for i in range(5)) / sum(counts.values())
    assert informative_share == pytest.approx(2 / 3, abs=0.015)  # weights 1 vs 0.5, N = 2000
    flat = Counter(i for e in range(10) for i in epoch_plan(families, probs, seed=0, epoch=e, scores=scores))
    assert set(flat.values()) == {10}  # strength 0: feedback ignored
    full = Counter(i for i in epoch_plan(families, probs, seed=0, epoch=0, scores=scores, strength=1.0))
    assert set(full) == set(range(5))  # strength 1: uninformative tasks are not issued


def test_adaptive_stats_window_and_restore() -> None:
    stats = AdaptiveStats(window=2)
    assert stats.score("t") is None
    for outcome in (False, True, True):
        stats.record("t", outcome)
    assert stats.score("t") == 1.0  # only the last two count
    stats.record("u", informative(0.0))
    assert stats.snapshot() == {"t": 1.0, "u": 0.0}
    assert stats.family_scores({"t": "f", "u": "f"}) == {"f": 0.5}
    again = AdaptiveStats()
    again.restore(stats.snapshot())
    assert again.snapshot() == stats.snapshot()


def test_apportion_sums_and_is_fair() -> None:
    rng = random.Random(0)
    counts = apportion({"x": 1.0, "y": 1.0, "z": 1.0}, 10, rng)
    assert sum(counts.values()) == 10 and sorted(counts.values()) == [3, 3, 4]


def test_a_mixture_of_hundreds_of_families_is_config_only(tmp_path) -> None:
    """300 task families from a JSONL source, weighted (and some left out) in the config file alone;
    the learner's per-family loss weights name them the same way."""
    import json

    from rollstream.config_load import load_config

    source = tmp_path / "tasks.jsonl"
    source.write_text("".join(json.dumps({"task_id": f"f{f}/t{t}", "family": f"f{f}", "prompt": "p",
                                          "reward": {"tests": ["assert True"]}}) + "\n"
                              for f in range(300) for t in range(2)))
    weights = "\n".join(f'f{f} = {0.0 if f % 10 == 0 else 1.0 + f % 3}' for f in range(300))
    (tmp_path / "mix.toml").write_text(f'[sampler]\nsources = ["jsonl:{source}"]\n\n[sampler.family_weights]\n'
                                       f'{weights}\n\n[learner.family_loss_weights]\nf1 = 2.0\nf2 = 0.5\n')
    config = load_config(str(tmp_path / "mix.toml"), environ={})
    tasks = load_tasks(config.sampler.sources)
    families = [t.family for t in tasks]
    probs = family_probabilities(Counter(families), config.sampler.family_weights, 0.0)
    assert len(probs) == 270 and "f0" not in probs and probs["f2"] == pytest.approx(3 * probs["f3"])
    issued = Counter(families[i] for epoch in range(4) for i in epoch_plan(families, probs, seed=0, epoch=epoch))
    assert set(issued) == set(probs)  # every weighted family is issued, no left-out one
    assert config.learner.family_loss_weights == {"f1": 2.0, "f2": 0.5}
