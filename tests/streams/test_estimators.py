"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest

from rollstream.streams import estimators
from rollstream.streams.estimators import GroupInput, batch_advantages, group_advantages

pytestmark = pytest.mark.unit

SQRT3 = math.sqrt(3.0)


def approx(values, rel=1e-9, abs=1e-12):
    return pytest.approx(values, rel=rel, abs=abs)


def test_grpo_is_mean_centred_and_divided_by_sample_std_plus_eps():
    # mean 2, sample std 1
    assert group_advantages([1.0, 2.0, 3.0], "grpo", std_eps=0.0) == approx([-1.0, 0.0, 1.0])
    assert group_advantages([1.0, 2.0, 3.0], "grpo", std_eps=1.0) == approx([-0.5, 0.0, 0.5])


def test_grpo_with_ties():
    # [1, 0, 0, 1]: mean 1/2, sample std sqrt(1/3): advantages +-(1/2) * sqrt(3)
    assert group_advantages([1, 0, 0, 1], "grpo", std_eps=0.0) == approx([SQRT3 / 2, -SQRT3 / 2, -SQRT3 / 2, SQRT3 / 2])
    # [0, 1, 1]: mean 2/3, sample std sqrt(1/3): -2/3*sqrt(3), 1/3*sqrt(3) twice
    assert group_advantages([0, 1, 1], "grpo", std_eps=0.0) == approx([-2 * SQRT3 / 3, SQRT3 / 3, SQRT3 / 3])


def test_dr_grpo_does_not_divide_by_std():
    assert group_advantages([0, 1, 1], "dr_grpo") == approx([-2 / 3, 1 / 3, 1 / 3])
    assert group_advantages([10, 20], "dr_grpo") == approx([-5.0, 5.0])


def test_rloo_leaves_one_out():
    assert group_advantages([0, 1, 1], "rloo") == approx([-1.0, 0.5, 0.5])
    # total 12: 1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3
    assert group_advantages([1, 2, 3, 6], "rloo") == approx([-8 / 3, -4 / 3, 0.0, 4.0])
    # RLOO = n/(n-1) * Dr. GRPO
    dr = group_advantages([1, 2, 3, 6], "dr_grpo")
    assert group_advantages([1, 2, 3, 6], "rloo") == approx([a * 4 / 3 for a in dr])


@pytest.mark.parametrize("estimator", estimators.ESTIMATORS)
def test_single_rollout_has_zero_advantage(estimator):
    assert group_advantages([5.0], estimator) == [0.0]


@pytest.mark.parametrize("estimator", estimators.ESTIMATORS)
def test_all_equal_rewards_give_zero_advantages(estimator):
    assert group_advantages([2.0, 2.0, 2.0], estimator, std_eps=1e-6) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("estimator", estimators.ESTIMATORS)
def test_nan_and_inf_rewards_are_rejected(estimator, bad):
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, bad, 0.0], estimator)
    with pytest.raises(ValueError, match="finite"):
        batch_advantages([GroupInput("t", [0.0, 1.0]), GroupInput("t", [bad, 1.0])], estimator)
    with pytest.raises(ValueError, match="finite"):
        estimators.clip_rewards([bad], 1.0)
    with pytest.raises(ValueError, match="finite"):
        estimators.filter_reason([0.0, bad], True)


def test_empty_group_and_unknown_estimator_are_errors():
    with pytest.raises(ValueError):
        group_advantages([], "grpo")
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        group_advantages([0.0, 1.0], "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown normalize"):
        batch_advantages([GroupInput("t", [0.0, 1.0])], "grpo", "global")  # type: ignore[arg-type]


def test_reward_clipping():
    assert estimators.clip_rewards([-3.0, 0.5, 3.0], 1.0) == [-1.0, 0.5, 1.0]
    assert estimators.clip_rewards([-3.0, 0.5, 3.0], None) == [-3.0, 0.5, 3.0]


def test_zero_variance_filter_reasons():
    assert estimators.filter_reason([1.0, 1.0, 1.0], True) == estimators.ZERO_VARIANCE
    assert estimators.filter_reason([1.0], True) == estimators.SINGLE_ROLLOUT
    assert estimators.filter_reason([1.0, 0.0], True) is None
    assert estimators.filter_reason([1.0, 1.0], False) is None


def test_batch_normalisation_centres_per_group_and_divides_by_batch_std():
    # pooled [0, 1, 0, 0, 2, 2]: mean 5/6, sum of squares 174/36, sample variance 29/30
    std = math.sqrt(29 / 30)
    out = batch_advantages([GroupInput("a", [0, 1]), GroupInput("b", [0, 0, 2, 2])], "grpo", "batch", std_eps=0.0)
    assert out[0] == approx([-0.5 / std, 0.5 / std])
    assert out[1] == approx([-1 / std, -1 / std, 1 / std, 1 / std])


def test_task_normalisation_pools_groups_of_the_same_task():
    # t1 pooled [0, 1, 1, 1]: sample std 1/2; t2 alone [0, 10]: sample std sqrt(50)
    groups = [GroupInput("t1", [0, 1]), GroupInput("t2", [0, 10]), GroupInput("t1", [1, 1])]
    out = batch_advantages(groups, "grpo", "task", std_eps=0.0)
    assert out[0] == approx([-1.0, 1.0])
    assert out[1] == approx([-5 / math.sqrt(50), 5 / math.sqrt(50)])
    assert out[2] == approx([0.0, 0.0])


def test_group_normalisation_in_a_batch_matches_single_groups():
    groups = [GroupInput("t1", [0, 1, 1]), GroupInput("t2", [1, 2, 3])]
    out = batch_advantages(groups, "grpo", "group", std_eps=1e-6)
    assert out == [group_advantages(g.rewards, "grpo", std_eps=1e-6) for g in groups]


@pytest.mark.parametrize("normalize", estimators.NORMALIZE)
def test_scope_does_not_change_dr_grpo_or_rloo(normalize):
    groups = [GroupInput("t1", [0, 1, 1]), GroupInput("t2", [1, 2, 6])]
    for estimator in ("dr_grpo", "rloo"):
        out = batch_advantages(groups, estimator, normalize)
        assert out == [group_advantages(g.rewards, estimator) for g in groups]


def test_reward_stats():
    stats = estimators.reward_stats([0.0, 1.0, 1.0])
    assert stats.mean == pytest.approx(2 / 3)
    assert stats.std == pytest.approx(1 / SQRT3)
    assert (stats.min, stats.max) == (0.0, 1.0)
    assert estimators.reward_stats([4.0]).std == 0.0
