"""Fixtures of the learner tests: tiny random Llama models and hand-made advantaged groups."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from schemas.events import AdvantagedRollout, GroupAdvantaged, GroupStats, Rollout

VOCAB = 64


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True, pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(config)


@pytest.fixture
def model() -> torch.nn.Module:
    return tiny_model()


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> str:
    path = tmp_path / "tiny-model"
    tiny_model().save_pretrained(path)
    return str(path)


def rollout(
    group_id: str, index: int, prompt: list[int], completion: list[int], *, version: int = 0,
    behaviour: list[float] | None = None, mask: list[int] | None = None, group_size: int = 4,
) -> Rollout:
    return Rollout(
        rollout_id=f"{group_id}/{index}", group_id=group_id, sample_index=index, group_size=group_size,
        task_id="t/0", family="t", prompt_token_ids=prompt, completion_token_ids=completion,
        behaviour_logprobs=behaviour if behaviour is not None else [-1.0] * len(completion),
        generated_mask=mask, policy_version_first=version, policy_version_last=version,
        issued_policy_version=version, finish_reason="stop",
    )


def group(group_id: str, advantages: list[float], *, version: int = 0, seed: int = 0,
          length: int = 6) -> GroupAdvantaged:
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i, adv in enumerate(advantages):
        prompt = torch.randint(1, VOCAB, (3,), generator=gen).tolist()
        completion = torch.randint(1, VOCAB, (length - (i % 3),), generator=gen).tolist()
        items.append(AdvantagedRollout(
            rollout=rollout(group_id, i, prompt, completion, version=version, group_size=len(advantages)),
            reward=adv, advantage=adv,
        ))
    rewards = [a for a in advantages]
    return GroupAdvantaged(
        group_id=group_id, task_id="t/0", family="t", estimator="grpo", complete=True, rollouts=items,
        stats=GroupStats(size=len(items), expected_size=len(items), reward_mean=0.0,
                         reward_std=float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
                         reward_min=min(rewards), reward_max=max(rewards)),
        emitted_at=time.time(),
    )
