"""Advantage estimators and policy losses register by name from outside their packages (a
function, or an entry point), are used by the stage that names them, and an unknown name stops
the stage at start with the registered names."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import Any

import pytest
import torch

from rollstream.config import LearnerConfig, LossConfig, OptimConfig
from rollstream.config_load import load_config
from rollstream.errors import ConfigError
from rollstream.learner import loss as losses
from rollstream.learner.trainer import Trainer
from rollstream.streams import estimators
from rollstream.streams.advantages import check_estimator
from tests.helpers import group, tiny_model

pytestmark = pytest.mark.unit


def max_baseline(rewards: Sequence[float], scale: float | None, std_eps: float) -> list[float]:
    """An estimator of this test's own: the group's best reward is the baseline."""
    return [r - max(rewards) for r in rewards]


def test_an_estimator_registered_from_outside_is_used_by_name() -> None:
    estimators.register_estimator("test_max_baseline", max_baseline)
    groups = [estimators.GroupInput("t", [1.0, 3.0, 2.0]), estimators.GroupInput("u", [0.5])]
    assert estimators.batch_advantages(groups, "test_max_baseline") == [[-2.0, 0.0, -1.0], [0.0]]
    assert "test_max_baseline" in estimators.estimator_names()
    check_estimator(load_config(None, ["stream.estimator=test_max_baseline"], environ={}))


def test_a_scaled_estimator_gets_the_scope_std() -> None:
    seen: list[float | None] = []

    def scaled(rewards: Sequence[float], scale: float | None, std_eps: float) -> list[float]:
        seen.append(scale)
        return [0.0] * len(rewards)

    estimators.register_estimator("test_scaled", scaled, scaled=True)
    groups = [estimators.GroupInput("t", [0.0, 2.0]), estimators.GroupInput("t", [0.0, 0.0])]
    estimators.batch_advantages(groups, "test_scaled", "task")
    assert seen == [pytest.approx(estimators.sample_std([0.0, 2.0, 0.0, 0.0]))] * 2


def test_an_estimator_from_an_entry_point() -> None:
    entry = metadata.EntryPoint(name="test_from_entry_point", value=f"{__name__}:max_baseline",
                                group=estimators.ENTRY_POINTS)
    estimators.load_entry_points([entry])
    assert estimators.group_advantages([1.0, 2.0], "test_from_entry_point") == [-1.0, 0.0]


def test_an_estimator_that_breaks_its_contract_is_refused() -> None:
    estimators.register_estimator("test_short", lambda rewards, scale, eps: [0.0])
    estimators.register_estimator("test_nan", lambda rewards, scale, eps: [float("nan")] * len(rewards))
    with pytest.raises(ValueError, match="gave 1 advantages for 3 rewards"):
        estimators.group_advantages([1.0, 2.0, 3.0], "test_short")
    with pytest.raises(ValueError, match="must be finite"):
        estimators.group_advantages([1.0, 2.0], "test_nan")


def test_the_stream_refuses_an_unknown_estimator_and_names_the_registered_ones() -> None:
    config = load_config(None, ["stream.estimator=nobody_registered_this"], environ={})
    with pytest.raises(ConfigError, match=r"stream.estimator: unknown advantage estimator 'nobody_registered_this'; "
                                          r"registered: .*dr_grpo, grpo.*rloo"):
        check_estimator(config)


def test_a_policy_loss_registered_from_outside_trains() -> None:
    calls: list[dict[str, Any]] = []

    def reinforce(logprobs: torch.Tensor, prox: torch.Tensor, behaviour: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor, settings: LossConfig, **kw: Any) -> tuple[torch.Tensor, dict[str, float]]:
        calls.append(kw)
        per_token = -advantages.to(logprobs.dtype).unsqueeze(1) * logprobs
        m = mask.to(logprobs.dtype)
        return losses.aggregate(per_token, m, settings.loss_agg, kw.get("step_tokens"),
                                kw.get("step_sequences")), {"tokens": float(m.sum())}

    losses.register_policy_loss("test_reinforce", reinforce)
    items = group("g", [1.0, -1.0, 0.5, -0.5], seed=3).rollouts
    model = tiny_model(seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, LearnerConfig(micro_batch=2, optim=OptimConfig(lr=1e-2),
                                           loss=LossConfig(objective="test_reinforce")))
    result = trainer.step(items)
    assert len(calls) == 2 and result.grad_norm > 0  # two micro-batches, through the registered loss
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_learner_refuses_an_unknown_policy_loss() -> None:
    with pytest.raises(ConfigError, match=r"learner.loss.objective: unknown policy loss 'nope'; registered: "
                                          r".*decoupled_ppo"):
        Trainer(tiny_model(), LearnerConfig(loss=LossConfig(objective="nope")))
