"""The off-policy loss, batching and staleness filtering (pure; tiny random models)."""

from __future__ import annotations

import math

import pytest
import torch

from rollstream.config import LearnerConfig, LossConfig, OptimConfig
from rollstream.learner.batch import collate, micro_batches, select_rollouts
from rollstream.learner.loss import aggregate, policy_loss, token_logprobs
from rollstream.learner.trainer import Trainer, sequence_logprob
from rollstream.schemas.events import AdvantagedRollout
from tests.helpers import group, rollout

pytestmark = pytest.mark.unit

EPS = 1e-4


def grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def on_policy_items(model: torch.nn.Module) -> list[AdvantagedRollout]:
    """Rollouts whose behaviour log-probs are the model's own (mu = pi)."""
    items = group("g", [1.0, -0.5, 0.25, -0.75]).rollouts
    with torch.no_grad():
        batch = collate(items)
        logp, _ = token_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                                 batch.input_ids)
    out = []
    for row, item in enumerate(items):
        r = item.rollout
        start = len(r.prompt_token_ids)
        mu = logp[row, start:start + len(r.completion_token_ids)].tolist()
        out.append(AdvantagedRollout(
            rollout=rollout(r.group_id, r.sample_index, list(r.prompt_token_ids), list(r.completion_token_ids),
                            behaviour=mu), reward=item.reward, advantage=item.advantage))
    return out


@pytest.mark.parametrize("agg", ["token_mean", "sequence_mean"])
def test_on_policy_gradient_is_plain_policy_gradient(model: torch.nn.Module, agg: str) -> None:
    items = on_policy_items(model)
    batch = collate(items)
    settings = LossConfig(loss_agg=agg)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp, entropy = token_logprobs(logits, batch.input_ids)
    loss, stats = policy_loss(logp, logp.detach(), batch.behaviour_logprobs, batch.advantages, batch.loss_mask,
                              settings, entropy=entropy)
    loss.backward()
    ours = grads(model).clone()
    model.zero_grad()

    # The textbook estimator: -(1/N) sum A_b grad log pi(y_t), N = tokens (or per-sequence means).
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.loss_mask[:, 1:]
    if agg == "token_mean":
        plain = -(batch.advantages[:, None] * lp * mask).sum() / mask.sum()
    else:
        plain = -((batch.advantages[:, None] * lp * mask).sum(1) / mask.sum(1)).mean()
    plain.backward()
    assert torch.allclose(ours, grads(model), atol=1e-6, rtol=1e-4)
    assert stats["is_mean"] == pytest.approx(1.0, abs=1e-5)  # mu = pi_prox: weight 1
    assert stats["clip_frac_low"] == stats["clip_frac_high"] == 0.0
    assert stats["entropy"] > 0


def test_trainer_step_moves_along_plain_gradient(model: torch.nn.Module) -> None:
    """One SGD-like AdamW step (first Adam step = lr * sign(grad)) on on-policy data."""
    items = on_policy_items(model)
    trainer = Trainer(model, LearnerConfig(micro_batch=3, optim=OptimConfig(lr=1e-3, grad_clip=1e9)))
    before = [p.detach().clone() for p in model.parameters()]
    batch = collate(items)
    logp_before = sequence_logprob(model, batch)
    result = trainer.step(items)
    assert result.tokens == batch.num_tokens and result.sequences == 4
    after = sequence_logprob(model, batch)
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(model.parameters(), before))
    assert moved > 0
    # Rollouts with the largest positive advantage gain log-prob, the most negative lose it.
    assert after[0] > logp_before[0] and after[3] < logp_before[3]


def scalar_case(logratio: float, adv: float, prox_minus_mu: float = 0.0, settings: LossConfig | None = None):
    settings = settings or LossConfig(clip_low=0.2, clip_high=0.28, is_cap=2.0)
    logp = torch.tensor([[logratio]], requires_grad=True)
    prox = torch.zeros(1, 1)
    mu = prox - prox_minus_mu
    loss, stats = policy_loss(logp, prox, mu, torch.tensor([adv]), torch.ones(1, 1), settings)
    loss.backward()
    return float(logp.grad), stats


def test_clip_high_acts_exactly_at_its_bound() -> None:
    inside, stats_in = scalar_case(math.log(1.28 - EPS), adv=1.0)
    outside, stats_out = scalar_case(math.log(1.28 + EPS), adv=1.0)
    assert inside == pytest.approx(-(1.28 - EPS), rel=1e-4)  # d(-r*A)/dlogp = -r*A
    assert outside == 0.0
    assert stats_in["clip_frac_high"] == 0.0 and stats_out["clip_frac_high"] == 1.0
    # A < 0 with a large ratio is never clipped (pessimistic min keeps the unclipped term).
    grad, stats = scalar_case(math.log(1.5), adv=-1.0)
    assert grad == pytest.approx(1.5, rel=1e-4) and stats["clip_frac_high"] == 0.0


def test_clip_low_acts_exactly_at_its_bound() -> None:
    inside, stats_in = scalar_case(math.log(0.8 + EPS), adv=-1.0)
    outside, stats_out = scalar_case(math.log(0.8 - EPS), adv=-1.0)
    assert inside == pytest.approx(0.8 + EPS, rel=1e-4)
    assert outside == 0.0
    assert stats_in["clip_frac_low"] == 0.0 and stats_out["clip_frac_low"] == 1.0
    grad, stats = scalar_case(math.log(0.5), adv=1.0)  # A > 0, small ratio: not clipped
    assert grad == pytest.approx(-0.5, rel=1e-4) and stats["clip_frac_low"] == 0.0


def test_is_weight_is_truncated_exactly_at_the_cap() -> None:
    below, s_below = scalar_case(0.0, adv=1.0, prox_minus_mu=math.log(2.0 - EPS))
    above, s_above = scalar_case(0.0, adv=1.0, prox_minus_mu=math.log(2.0 + EPS))
    far, s_far = scalar_case(0.0, adv=1.0, prox_minus_mu=math.log(50.0))
    assert below == pytest.approx(-(2.0 - EPS), rel=1e-5)
    assert above == pytest.approx(-2.0, rel=1e-6) and far == pytest.approx(-2.0, rel=1e-6)
    assert s_below["is_trunc_frac"] == 0.0 and s_above["is_trunc_frac"] == 1.0
    assert s_far["is_max"] == pytest.approx(2.0)
    weighted, _ = scalar_case(0.0, adv=1.0, prox_minus_mu=math.log(0.5))  # mu more likely: weight < 1
    assert weighted == pytest.approx(-0.5, rel=1e-5)


def test_kl_k3_is_zero_at_the_reference_and_pulls_back_towards_it() -> None:
    settings = LossConfig(kl_beta=0.5)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    same, stats = policy_loss(logp, logp.detach(), logp.detach(), torch.tensor([0.0]), torch.ones(1, 2),
                              settings, ref_logprobs=logp.detach())
    assert float(same.detach()) == pytest.approx(0.0, abs=1e-7) and stats["kl"] == pytest.approx(0.0, abs=1e-7)
    ref = torch.tensor([[-1.5, -1.5]])
    loss, stats = policy_loss(logp, logp.detach(), logp.detach(), torch.tensor([0.0]), torch.ones(1, 2),
                              settings, ref_logprobs=ref)
    loss.backward()
    assert stats["kl"] > 0
    # The KL gradient pushes log pi towards log pi_ref: down where above it, up where below.
    assert logp.grad[0, 0] > 0 and logp.grad[0, 1] < 0


def test_aggregation_modes_and_exact_accumulation() -> None:
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(aggregate(per_token, mask, "token_mean")) == pytest.approx(8.0 / 5.0)
    assert float(aggregate(per_token, mask, "sequence_mean")) == pytest.approx((1.0 + 4.0) / 2.0)
    empty = torch.zeros(1, 4)
    assert float(aggregate(per_token[:1], empty, "sequence_mean")) == 0.0
    # Micro-batch losses with step-wide denominators sum to the full-batch loss.
    for mode in ("token_mean", "sequence_mean"):
        full = aggregate(per_token, mask, mode)
        split = sum(aggregate(per_token[i:i + 1], mask[i:i + 1], mode, step_tokens=5, step_sequences=2)
                    for i in range(2))
        assert float(split) == pytest.approx(float(full))


@pytest.mark.parametrize("agg", ["token_mean", "sequence_mean"])
def test_gradient_accumulation_matches_one_big_batch(agg: str) -> None:
    from tests.helpers import tiny_model

    items = group("g", [1.0, -1.0, 0.5, -0.5, 2.0], seed=3).rollouts
    norms = []
    for micro in (5, 2):
        model = tiny_model(seed=1)
        trainer = Trainer(model, LearnerConfig(micro_batch=micro, optim=OptimConfig(grad_clip=1e9),
                                               loss=LossConfig(loss_agg=agg)))
        norms.append(trainer.step(items).grad_norm)
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)


def test_observation_tokens_are_not_trained() -> None:
    item = AdvantagedRollout(
        rollout=rollout("g", 0, [1, 2], [5, 6, 7, 8], behaviour=[-1.0, -1.0, -1.0, -1.0], mask=[1, 0, 0, 1]),
        reward=1.0, advantage=1.0)
    batch = collate([item])
    assert batch.loss_mask.tolist() == [[0, 0, 1, 0, 0, 1]]
    assert batch.behaviour_logprobs.tolist() == [[0, 0, -1.0, 0, 0, -1.0]]
    assert batch.num_tokens == 2


def test_collate_pads_and_aligns() -> None:
    items = [AdvantagedRollout(rollout=rollout("g", 0, [1, 2, 3], [4, 5]), reward=1.0, advantage=0.5),
             AdvantagedRollout(rollout=rollout("g", 1, [1], [9, 9, 9, 9, 9]), reward=0.0, advantage=-0.5)]
    batch = collate(items, pad_id=0)
    assert batch.input_ids.shape == (2, 6)
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert batch.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1]]
    assert batch.advantages.tolist() == [0.5, -0.5]
    assert [b.input_ids.shape[0] for b in micro_batches(items * 3, 4)] == [4, 2]


def test_stale_rollouts_are_dropped_and_counted() -> None:
    groups = [group("a", [1.0, -1.0], version=5), group("b", [1.0, -1.0], version=3),
              group("c", [1.0, -1.0], version=2), group("d", [1.0, -1.0], version=7)]
    selection = select_rollouts(groups, current_version=5, max_staleness=2)
    kept = {i.rollout.group_id for i in selection.rollouts}
    assert kept == {"a", "b", "d"}  # lag 0, lag 2 (at the bound), newer (dead lineage): kept
    assert selection.stale == 2  # group c: lag 3
    assert sorted(selection.lags) == [-2, -2, 0, 0, 2, 2, 3, 3]
    on_policy = select_rollouts(groups, current_version=5, max_staleness=0)
    assert {i.rollout.group_id for i in on_policy.rollouts} == {"a", "d"} and on_policy.stale == 4


def test_empty_completions_are_skipped() -> None:
    g = group("e", [1.0, -1.0])
    empty = AdvantagedRollout(rollout=rollout("e", 2, [1, 2], []), reward=0.0, advantage=0.0)
    selection = select_rollouts([g.__class__(**{**{f: getattr(g, f) for f in g.__struct_fields__},
                                                "rollouts": [*g.rollouts, empty]})], 0, 1)
    assert selection.empty == 1 and len(selection.rollouts) == 2


def test_temperature_scales_the_learner_logprobs() -> None:
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])  # [1, 2, 3]
    ids = torch.tensor([[0, 0]])
    cold, _ = token_logprobs(logits, ids, torch.tensor([1.0]))
    hot, _ = token_logprobs(logits, ids, torch.tensor([2.0]))
    assert float(cold[0, 1]) == pytest.approx(2.0 - math.log(math.exp(2) + 2))
    assert float(hot[0, 1]) == pytest.approx(1.0 - math.log(math.exp(1) + 2))


def test_updates_per_step_recomputes_prox_and_clips(model: torch.nn.Module) -> None:
    items = on_policy_items(model)
    trainer = Trainer(model, LearnerConfig(micro_batch=2, updates_per_step=2, optim=OptimConfig(lr=0.05, grad_clip=1e9)))
    result = trainer.step(items)
    # The second update sees a moved policy: ratios != 1, and at lr 0.05 some tokens clip.
    assert result.stats["clip_frac_low"] + result.stats["clip_frac_high"] > 0


def test_completion_logprobs_match_full_logits_from_the_first_generated_token(model: torch.nn.Module) -> None:
    """The learner projects to the vocabulary only from the last prompt position on (the prompt
    positions before it are never trained): log-probs and entropy at every generated token are
    those of the full forward, gradients too, and the skipped positions read 0."""
    from rollstream.learner.trainer import completion_logprobs

    items = [AdvantagedRollout(rollout=rollout("g", i, prompt, completion), reward=0.0, advantage=a)
             for i, (prompt, completion, a) in enumerate([([5, 6, 7, 8, 9], [10, 11, 12], 1.0),
                                                          ([5, 6, 7], [13, 14, 15, 16], -1.0)])]
    batch = collate(items)
    temps = torch.tensor([0.7, 1.3])
    batch = type(batch)(**{**batch.__dict__, "temperatures": temps})
    full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    want_lp, want_ent = token_logprobs(full, batch.input_ids, temps)
    (want_lp * batch.loss_mask).sum().backward()
    want_grad = grads(model).clone()
    model.zero_grad(set_to_none=True)

    got_lp, got_ent = completion_logprobs(model, batch)
    assert got_lp.shape == want_lp.shape == batch.input_ids.shape
    mask = batch.loss_mask.bool()
    assert torch.allclose(got_lp[mask], want_lp[mask], atol=1e-5)
    assert torch.allclose(got_ent[mask], want_ent[mask], atol=1e-4)
    assert (got_lp[:, :2] == 0).all()  # before the shortest prompt's last position: no logits
    (got_lp * batch.loss_mask).sum().backward()
    assert torch.allclose(grads(model), want_grad, atol=1e-5)
