"""The sampling math, pure: logits in, the processed distribution and the sampled tokens out.

Order, per row (the same as transformers' logits processors): divide by the temperature,
keep the ``top_k`` largest logits, keep the smallest set of the remaining tokens whose
probability mass reaches ``top_p`` (the first token is always kept), renormalise, draw.

The recorded behaviour log-prob of a sampled token is its log-probability under the
*tempered, untruncated* distribution (the softmax of logits / temperature), on every backend:
it is what SGLang returns, and what the learner computes for the proximal and current policy
at the rollout's ``logprob_temperature``, so the importance weight pi_prox / mu compares the
same kind of distribution. Top-p and top-k are a filter on what gets sampled, not part of the
policy being trained; with them, mu is the untruncated distribution (the weight slightly
over-counts the kept tokens by 1 / kept mass, a bias that vanishes as top_p -> 1 and
top_k -> 0). docs/generator.md has the reasoning.

Greedy rows (temperature 0) pick the argmax; their recorded log-prob is that of the plain
softmax of the logits (temperature 1, no truncation), since the point mass actually used
carries no information for importance weighting. ``logprob_temperature`` is 1 for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def logprob_temperature(temperature: float) -> float:
    """The temperature the recorded log-probs are computed at (1 for greedy)."""
    return temperature if temperature > 0 else 1.0


def tempered_logprobs(
    logits: torch.Tensor,  # [B, V]
    temperature: torch.Tensor,  # [B]; 0 = greedy (then temperature 1)
) -> torch.Tensor:  # [B, V]
    """Log-probs of the tempered, untruncated distribution: what behaviour log-probs record."""
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    return (logits.float() / temp[:, None]).log_softmax(dim=-1)


def truncates(top_p: torch.Tensor, top_k: torch.Tensor, vocab: int) -> bool:
    """Whether any row cuts the distribution (then sampled and recorded distributions differ)."""
    return bool(((top_k > 0) & (top_k < vocab)).any()) or bool((top_p < 1.0).any())


def processed_logprobs(
    logits: torch.Tensor,  # [B, V]
    temperature: torch.Tensor,  # [B]; 0 = greedy
    top_p: torch.Tensor,  # [B]; 1 = off
    top_k: torch.Tensor,  # [B] int; 0 = off
) -> torch.Tensor:  # [B, V] log-probs, -inf outside the kept set
    logits = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / temp[:, None]  # [B, V]
    vocab = scaled.shape[-1]
    k = torch.where(greedy | (top_k <= 0), torch.full_like(top_k, vocab), top_k.clamp(max=vocab))
    p = torch.where(greedy, torch.ones_like(top_p), top_p).float()
    if bool((k < vocab).any()) or bool((p < 1.0).any()):
        sorted_logits, order = scaled.sort(dim=-1, descending=True)  # [B, V]
        ranks = torch.arange(vocab, device=scaled.device)[None, :]  # [1, V]
        keep = ranks < k[:, None]  # [B, V]
        masked = sorted_logits.masked_fill(~keep, float("-inf"))
        probs = masked.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # exclusive cumulative mass [B, V]
        keep &= mass_before < p[:, None]
        masked = sorted_logits.masked_fill(~keep, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(1, order, masked)
    return scaled.log_softmax(dim=-1)


def sample_tokens(
    logprobs: torch.Tensor,  # [B, V] from processed_logprobs
    greedy: Sequence[bool],
    generators: Sequence[torch.Generator],
    recorded: torch.Tensor | None = None,  # [B, V] the log-probs to record (default: ``logprobs``)
) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B] long, their recorded log-probs [B] float
    """Draw one token per row with that row's own generator (so each row's stream depends only
    on its seed and its own logits, not on its neighbours in the batch)."""
    probs = logprobs.exp()  # [B, V]
    tokens = torch.empty(len(greedy), dtype=torch.long, device=logprobs.device)
    for row, (is_greedy, generator) in enumerate(zip(greedy, generators, strict=True)):
        if is_greedy:
            tokens[row] = logprobs[row].argmax()
        else:
            tokens[row] = torch.multinomial(probs[row], 1, generator=generator)[0]
    chosen = (logprobs if recorded is None else recorded).gather(1, tokens[:, None])[:, 0]  # [B]
    return tokens, chosen


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Index just past the earliest stop string in ``text``, or -1."""
    best = -1
    for stop in stops:
        if stop:
            at = text.find(stop)
            if at >= 0 and (best < 0 or at + len(stop) < best):
                best = at + len(stop)
    return best


def derive_seed(base: int, group_id: str, sample_index: int) -> int:
    """A 63-bit seed per sample, stable across processes and restarts."""
    import hashlib

    digest = hashlib.blake2b(f"{base}|{group_id}|{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
