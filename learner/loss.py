"""The off-policy GRPO loss (decoupled PPO with clip-higher and a truncated IS weight).

Pure tensor math, no I/O. For every generated token t of rollout b (``loss_mask[b, t] = 1``):

    r_t   = pi_theta(y_t) / pi_prox(y_t)                    (ratio to the proximal policy)
    w_t   = min(pi_prox(y_t) / mu(y_t), C)                  (truncated behaviour IS weight, no grad)
    obj_t = w_t * min(r_t * A_b, clip(r_t, 1 - eps_low, 1 + eps_high) * A_b)
    loss_t = -obj_t + beta * KL_t

* ``pi_prox`` is the policy at the start of the optimizer step (detached), ``mu`` the
  behaviour policy that sampled the token (the generator's ``behaviour_logprobs``), ``A_b`` the
  rollout's group-relative advantage. Decoupling ``pi_prox`` from ``mu`` (Hilton et al. 2022,
  AReaL) lets the trust region be taken around the current policy while the IS weight corrects
  for stale samples; ``C`` (``is_cap``) bounds the weight's variance.
* Clip-higher (DAPO): ``eps_high > eps_low`` gives low-probability tokens with A > 0 more room.
* ``KL_t`` is the k3 estimator of KL(pi_theta || pi_ref): ``exp(d) - d - 1`` with
  ``d = log pi_ref - log pi_theta`` (unbiased, always >= 0; Schulman 2020). Off at beta = 0.
* Aggregation: ``token_mean`` divides the summed token losses by the number of generated tokens
  in the whole optimizer step; ``sequence_mean`` averages each rollout's tokens, then the
  rollouts. The step-wide denominators are passed in, so summing the losses of the micro-batches
  of a step gives exactly the loss of the full batch (gradient accumulation is exact).

With one update per step and pi_prox taken from the same forward (r = 1), the gradient is
``w * A * grad log pi_theta`` aggregated as above: on-policy (w = 1) the plain policy-gradient
estimator.

**Other objectives** register by name (``learner.loss.objective``), as reward kinds and advantage
estimators do: :func:`register_policy_loss` in the learner's process, or an entry point of the
group ``rollstream.policy_losses``; a loss has :func:`policy_loss`'s signature and returns the
(micro-)batch's scalar loss and its statistics (use :func:`aggregate` so gradient accumulation
stays exact; the statistics :func:`policy_loss` reports that it leaves out read 0). The learner refuses to start with a name nobody registered. Example::

    from rollstream.learner.loss import aggregate, register_policy_loss

    def reinforce(logprobs, prox, behaviour, advantages, mask, settings, **kw):
        per_token = -advantages.unsqueeze(1) * logprobs
        return aggregate(per_token, mask.to(logprobs.dtype), settings.loss_agg,
                         kw.get("step_tokens"), kw.get("step_sequences")), {"tokens": float(mask.sum())}

    register_policy_loss("reinforce", reinforce)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any, Literal

import torch

from rollstream.config import LossConfig
from rollstream.registry import Registry

LossAgg = Literal["token_mean", "sequence_mean"]


CHUNK_ELEMENTS = 1 << 22  # ~16 MB of fp32 logits at a time in the fused log-prob pass


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each next token and the entropy of each next-token distribution.

    ``logits`` [B, T, V] from a causal LM over ``input_ids`` [B, T]; ``temperature`` [B] (the
    rollouts' ``logprob_temperature``; the behaviour log-probs are of the tempered distribution,
    so the learner's must be too). Returns ``(logprobs, entropy)``, each [B, T] and aligned with
    ``input_ids``: position t holds log p(input_ids[t] | input_ids[:t]); position 0 (no
    prefix) is 0. Entropy is computed without gradient (it is reported, not optimised).

    No [B, T, V] log-softmax is materialised or kept for backward: ``SampledLogprob`` computes
    ``logits[y] / tau - logsumexp(logits / tau)`` a chunk of positions at a time and its backward
    writes ``(onehot(y) - softmax) / tau`` straight into the logits' gradient.
    """
    temps = None if temperature is None else temperature.clamp_min(1e-6).float()
    logprobs, entropy = sampled_logprobs(logits[:, :-1], input_ids[:, 1:], temps)  # [B, T-1] each
    pad = logprobs.new_zeros(logprobs.shape[0], 1)
    return torch.cat([pad, logprobs], dim=1), torch.cat([pad, entropy], dim=1)


def sampled_logprobs(logits: torch.Tensor, targets: torch.Tensor,
                     temperature: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(logits / tau)[targets]`` [B, N] (with grad) and the entropy [B, N] (without),
    for ``logits`` [B, N, V], ``targets`` [B, N], ``temperature`` [B] (None: 1)."""
    if temperature is None:
        temperature = torch.ones(logits.shape[0], dtype=torch.float32, device=logits.device)
    logprobs, entropy = SampledLogprob.apply(logits, targets, temperature.to(logits.device))
    return logprobs, entropy


def _chunks(logits: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, stop) spans of positions, each about CHUNK_ELEMENTS logits."""
    _, length, vocab = logits.shape
    rows = logits.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(vocab, 1))
    return [(b, t, min(t + step, length)) for b in range(rows) for t in range(0, length, step)]


class SampledLogprob(torch.autograd.Function):
    """Fused, chunked log-prob of the sampled tokens and entropy; saves only the logits."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor,
                temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, length, _ = logits.shape
        logprobs = torch.empty(rows, length, dtype=torch.float32, device=logits.device)
        entropy = torch.empty_like(logprobs)
        lse = torch.empty_like(logprobs)
        for b, t0, t1 in _chunks(logits):
            x = logits[b, t0:t1].float() / temperature[b]  # [n, V]
            chunk_lse = torch.logsumexp(x, dim=-1)  # [n]
            lse[b, t0:t1] = chunk_lse
            logprobs[b, t0:t1] = x.gather(-1, targets[b, t0:t1].unsqueeze(-1)).squeeze(-1) - chunk_lse
            probs = torch.exp(x - chunk_lse.unsqueeze(-1))
            entropy[b, t0:t1] = chunk_lse - (probs * x).sum(-1)
        ctx.save_for_backward(logits, targets, temperature, lse)
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        logits, targets, temperature, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for b, t0, t1 in _chunks(logits):
            x = logits[b, t0:t1].float() / temperature[b]  # [n, V]
            g = (grad_logprobs[b, t0:t1] / temperature[b]).unsqueeze(-1)  # [n, 1]
            chunk = torch.exp(x - lse[b, t0:t1].unsqueeze(-1)).mul_(-g)  # -softmax * g / tau
            chunk.scatter_add_(-1, targets[b, t0:t1].unsqueeze(-1), g)
            grad[b, t0:t1] = chunk.to(grad.dtype)
        return grad, None, None


def policy_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    settings: LossConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    step_tokens: float | None = None,
    step_sequences: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one (micro-)batch and its statistics. ``weights`` [B]: each rollout's weight in
    the loss (multi-task training: its family's times its domain's; the denominators are not
    reweighted).

    ``logprobs`` [B, T] (with grad), ``prox_logprobs`` and ``behaviour_logprobs`` [B, T],
    ``advantages`` [B], ``loss_mask`` [B, T] (1 on generated tokens). ``step_tokens`` /
    ``step_sequences``: the denominators of the whole optimizer step (default: this batch's).
    Stats are sums/counts-free ratios over this batch's masked tokens:
    ``clip_frac_low/high`` (tokens whose clipped branch is active, i.e. whose gradient is
    zeroed, below/above), ``is_mean/is_max`` (truncated weight), ``is_trunc_frac``
    (tokens with pi_prox/mu > C), ``kl`` (mean k3), ``entropy`` (mean), ``tokens``.
    """
    mask = loss_mask.to(logprobs.dtype)  # [B, T]
    prox = prox_logprobs.detach()
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logprobs - prox)  # [B, T]
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    objective = torch.minimum(ratio * adv, clipped * adv)  # [B, T]
    raw_is = torch.exp((prox - behaviour_logprobs.to(prox.dtype)).clamp(max=50.0))  # [B, T]
    is_weight = raw_is.clamp(max=settings.is_cap).detach()
    per_token = -is_weight * objective  # [B, T]
    kl = None
    if ref_logprobs is not None and settings.kl_beta > 0:
        delta = ref_logprobs.detach() - logprobs
        kl = torch.exp(delta) - delta - 1.0  # [B, T], k3 >= 0
        per_token = per_token + settings.kl_beta * kl
    if weights is not None:
        per_token = per_token * weights.to(per_token.dtype).unsqueeze(1)
    loss = aggregate(per_token, mask, settings.loss_agg, step_tokens, step_sequences)
    with torch.no_grad():
        n = mask.sum().clamp_min(1.0)
        low = ((ratio < 1.0 - settings.clip_low) & (adv < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + settings.clip_high) & (adv > 0)).to(mask.dtype) * mask
        masked_is = is_weight * mask
        stats = {
            "tokens": float(mask.sum()),
            "clip_frac_low": float(low.sum() / n),
            "clip_frac_high": float(high.sum() / n),
            "is_mean": float(masked_is.sum() / n),
            "is_max": float(masked_is.max()) if mask.any() else 0.0,
            "is_trunc_frac": float(((raw_is > settings.is_cap).to(mask.dtype) * mask).sum() / n),
            "kl": float((kl.detach() * mask).sum() / n) if kl is not None else 0.0,
            "entropy": float((entropy * mask).sum() / n) if entropy is not None else 0.0,
        }
    return loss, stats


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
"""A policy loss: :func:`policy_loss`'s arguments -> (scalar loss, statistics)."""
ENTRY_POINTS = "rollstream.policy_losses"
REGISTRY: Registry[PolicyLoss] = Registry("policy loss", ENTRY_POINTS, "register_policy_loss",
                                          {"decoupled_ppo": policy_loss})


def register_policy_loss(name: str, loss: PolicyLoss) -> PolicyLoss:
    """Register ``loss`` under ``name`` (replacing one of that name) and return it."""
    return REGISTRY.register(name, loss)


def load_entry_points(found: Iterable[metadata.EntryPoint] | None = None) -> None:
    """Register every loss of the ``rollstream.policy_losses`` entry-point group (once)."""
    REGISTRY.load_entry_points(found)


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as ``name``; ValueError naming the registered ones otherwise."""
    return REGISTRY.get(name)


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAgg,
    step_tokens: float | None = None,
    step_sequences: float | None = None,
) -> torch.Tensor:
    """Scalar loss from per-token losses [B, T] under ``mask`` [B, T].

    ``token_mean``: sum / ``step_tokens``. ``sequence_mean``: sum over rollouts of (their token
    sum / their token count) / ``step_sequences``; rollouts with no generated token count for
    nothing (neither numerator nor denominator).
    """
    masked = per_token * mask
    if mode == "token_mean":
        denom = float(step_tokens) if step_tokens is not None else float(mask.sum())
        return masked.sum() / max(denom, 1.0)
    if mode == "sequence_mean":
        lengths = mask.sum(1)  # [B]
        has_tokens = lengths > 0
        per_seq = masked.sum(1) / lengths.clamp_min(1.0)  # [B]
        denom = float(step_sequences) if step_sequences is not None else float(has_tokens.sum())
        return per_seq[has_tokens].sum() / max(denom, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; expected token_mean or sequence_mean")
