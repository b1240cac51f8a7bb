"""Multi-task joint training, pure: per-family advantage normalisation in the stream's estimators
and per-family loss weights in the learner (a family's weight scales its rollouts' gradient
exactly; weight 0 takes it out of the gradient)."""

from __future__ import annotations

import msgspec
import pytest
import torch

from rollstream.config import LearnerConfig, LossConfig
from rollstream.learner.batch import collate
from rollstream.learner.trainer import Trainer
from rollstream.schemas.events import AdvantagedRollout
from rollstream.streams.estimators import GroupInput, batch_advantages, sample_std
from tests.helpers import rollout, tiny_model

pytestmark = pytest.mark.unit

def test_family_normalisation_puts_each_family_on_its_own_scale() -> None:
    groups = [GroupInput("a/1", [0.0, 1.0], "a"), GroupInput("a/2", [0.0, 0.5], "a"),
              GroupInput("b/1", [0.0, 10.0], "b"), GroupInput("b/2", [5.0, 10.0], "b")]
    advantages = batch_advantages(groups, "grpo", "family")
    std_a, std_b = sample_std([0.0, 1.0, 0.0, 0.5]), sample_std([0.0, 10.0, 5.0, 10.0])
    assert abs(advantages[0][1] - 0.5 / (std_a + 1e-6)) < 1e-6
    assert abs(advantages[2][1] - 5.0 / (std_b + 1e-6)) < 1e-6
    assert abs(advantages[3][0] - -2.5 / (std_b + 1e-6)) < 1e-6
    # by task, every group here is its own scope: the same as per group
    assert batch_advantages(groups, "grpo", "task") == batch_advantages(groups, "grpo", "group")


def _gradient(family_weights: dict[str, float]) -> torch.Tensor:
    torch.manual_seed(0)
    model = tiny_model()
    items = [AdvantagedRollout(rollout=msgspec.structs.replace(rollout(f"g{i}", i, [1, 2, 3], [4 + i, 5, 6 + i]),
                                                              family="a" if i < 2 else "b"),
                               reward=float(i % 2), advantage=1.0 if i % 2 else -1.0) for i in range(4)]
    batch = collate(items, family_weights=family_weights)
    trainer = Trainer(model, LearnerConfig(family_loss_weights=family_weights,
                                           loss=LossConfig(loss_agg="sequence_mean")))
    trainer._micro_step(batch, None, batch.num_tokens, 4)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_family_loss_weights_scale_each_familys_gradient() -> None:
    only_a = _gradient({"b": 0.0})
    only_b = _gradient({"a": 0.0})
    both = _gradient({})
    assert torch.allclose(only_a + only_b, both, atol=1e-6)
    assert torch.allclose(_gradient({"b": 0.0, "a": 3.0}), 3 * only_a, atol=1e-6)
    assert only_a.abs().sum() > 0 and only_b.abs().sum() > 0
