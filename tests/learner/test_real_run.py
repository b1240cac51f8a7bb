"""A short real run of the learner stage on SmolLM2-135M-Instruct (slow: loads the real model).

Two fixed groups (a rewarded and a penalised completion each), replayed under fresh group ids
for three steps with the behaviour log-probs of the initial model. The loss must fall (the IS
weight of rewarded tokens grows as they become likelier) and the rewarded completions must gain
log-prob, and more than the penalised ones of the same group. The trained checkpoint and the broadcast weights
must load into plain transformers models.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
import torch

from rollstream.config import CheckpointConfig, Config, LearnerConfig, OptimConfig, RLConfig
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.learner.batch import collate
from rollstream.learner.checkpoint import latest_checkpoint, read_step_log
from rollstream.learner.train import run
from rollstream.learner.trainer import sequence_logprob
from rollstream.models import load_model, load_tokenizer
from rollstream.redis import connect
from rollstream.schemas.events import AdvantagedRollout, GroupAdvantaged, GroupStats, Rollout
from rollstream.weights import WeightStore

pytestmark = pytest.mark.integration

CASES = [
    ("What is 2 + 2? Answer with one number.", "4", "5"),
    ("What is the capital of France? One word.", "Paris", "London"),
]


def build_items(tokenizer, model) -> list[tuple[list[int], list[int], float]]:
    items = []
    for question, good, bad in CASES:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        for text, adv in ((good, 1.0), (bad, -1.0)):
            items.append((prompt_ids, tokenizer(text + "<|im_end|>", add_special_tokens=False)["input_ids"], adv))
    return items


def as_groups(items, model, copy: int) -> list[GroupAdvantaged]:
    """On-policy behaviour log-probs of the initial model (mu = pi_0)."""
    groups = []
    for g in range(len(CASES)):
        gid = f"real{copy}-{g}"
        rollouts = []
        for i, (prompt, completion, adv) in enumerate(items[2 * g: 2 * g + 2]):
            draft = Rollout(rollout_id=f"{gid}/{i}", group_id=gid, sample_index=i, group_size=2, task_id=f"t{g}",
                            family="t", prompt_token_ids=prompt, completion_token_ids=completion,
                            behaviour_logprobs=[-1.0] * len(completion), policy_version_first=0,
                            policy_version_last=0, issued_policy_version=0, finish_reason="stop")
            batch = collate([AdvantagedRollout(rollout=draft, reward=adv, advantage=adv)])
            with torch.no_grad():
                logits = model(input_ids=batch.input_ids).logits
                lp = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, batch.input_ids[0, 1:, None])[:, 0]
            mu = lp[len(prompt) - 1:].clamp(max=0.0).tolist()
            rollouts.append(AdvantagedRollout(rollout=msgspec.structs.replace(draft, behaviour_logprobs=mu),
                                              reward=adv, advantage=adv))
        groups.append(GroupAdvantaged(group_id=gid, task_id=f"t{g}", family="t", estimator="grpo", complete=True,
                                      rollouts=rollouts, stats=GroupStats(size=2, expected_size=2, reward_mean=0.0,
                                      reward_std=1.0, reward_min=-1.0, reward_max=1.0), emitted_at=time.time()))
    return groups


async def test_smollm2_learns_from_a_fixed_set_of_groups(config: Config, tmp_path: Path) -> None:
    base = await asyncio.to_thread(load_model, "smollm2")  # what learner.model = "smollm2" loads
    tokenizer = await asyncio.to_thread(load_tokenizer, "smollm2")
    base_dir = tmp_path / "smollm2-hf"
    base.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    items = build_items(tokenizer, base)
    groups = [g for copy in range(3) for g in as_groups(items, base, copy)]
    probe = collate([r for g in groups[:2] for r in g.rollouts])
    before = sequence_logprob(base, probe)
    del base

    config = msgspec.structs.replace(
        config,
        rl=RLConfig(groups_per_step=2, max_staleness=10),
        learner=LearnerConfig(model=str(base_dir), micro_batch=4, optim=OptimConfig(lr=1e-5),
                              checkpoint=CheckpointConfig(every=0, dir=str(tmp_path / "ckpt")),
                              broadcast_every=3, max_steps=3),
    )
    await ensure_topics(config.infra, ["advantages", "policy"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("advantages", g) for g in groups])
    await run(config)

    log = read_step_log(tmp_path / "ckpt")
    losses = [r["loss"] for r in log]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(latest_checkpoint(tmp_path / "ckpt") / "model")
    after = sequence_logprob(trained, probe)
    good, bad = probe.advantages > 0, probe.advantages < 0
    assert bool((after[good] > before[good]).all()), (before, after)
    # Penalised answers share tokens with rewarded ones ("4" / "5"), so they may rise too, but
    # within each group the rewarded completion must pull ahead of the penalised one.
    assert bool((after[good] - after[bad] > before[good] - before[bad]).all()), (before, after)

    redis = connect(config.infra.redis_url)
    try:
        version, weights = await WeightStore(redis, key_prefix=config.infra.key_prefix).fetch()
    finally:
        await redis.aclose()
    assert version == 3
    plain = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    missing, unexpected = plain.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    expected = trained.state_dict()
    for name, tensor in weights.items():  # exactly the checkpointed weights, rounded to bf16
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name
