"""The transformers backend: a KV-cached sampling loop over a local causal LM.

Why not ``model.generate``: the behaviour log-probs must be those of the exact distribution
each token was drawn from, per row, with per-row temperature/top-p/top-k and per-row seeds.
A short loop (one prefill, then one forward per token, our own sampling on the logits, see
``sampling.py``) gives that directly and lets finished rows leave the batch.

Batches are left-padded; position ids skip the padding, so each row computes what it would
alone (up to float rounding). The prompt is prefilled once per distinct prompt (the G samples
of a group share it) and its KV cache copied to each of its rows before decoding: the prefill
costs one row per group instead of G. The model's dtype (``generator.dtype``) is that of the
whole forward; bfloat16 weights use the CPU's AVX-512-BF16 kernels and record behaviour
log-probs within 0.5 per token of float32's (measured: max 0.39, mean 0.02, SmolLM2; see
docs/generator.md). Weights are swapped only between batches (one asyncio lock guards both),
after the whole new state dict was checked and cast to the model's dtype, so a batch never
sees a half-loaded model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rollstream.consumers.generator.backends.base import (
    Completion,
    GenerationRequest,
    error_completion,
    prompt_too_long,
)
from rollstream.consumers.generator.backends.sampling import (
    find_stop,
    logprob_temperature,
    processed_logprobs,
    sample_tokens,
    tempered_logprobs,
    truncates,
)
from rollstream.consumers.generator.chat import eos_token_ids, max_context
from rollstream.errors import BackendError
from rollstream.models import load_policy, tied_parameter_names


@dataclass
class _Row:
    """Bookkeeping of one request while its tokens are sampled."""

    request: GenerationRequest
    limit: int  # most new tokens: max_new_tokens, cut to what the context allows
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    first_token_at: float | None = None

    def push(self, token: int, logprob: float, eos: set[int], tokenizer: Any) -> bool:
        """Record a sampled token; True when the row is finished."""
        if self.first_token_at is None:
            self.first_token_at = time.time()
        self.tokens.append(token)
        self.logprobs.append(logprob)
        if token in eos:
            self.finish = "stop"
        elif self.request.sampling.stop and find_stop(self._text(tokenizer), self.request.sampling.stop) >= 0:
            # Keep the token that completed the stop string (it was sampled and has a
            # log-prob); the text is the decode of exactly the kept tokens.
            self.finish = "stop"
        elif len(self.tokens) >= self.limit:
            self.finish = "length"
        return self.finish is not None

    def _text(self, tokenizer: Any) -> str:
        return tokenizer.decode(self.tokens, skip_special_tokens=True)

    def completion(self, tokenizer: Any, version: int) -> Completion:
        return Completion(
            request_id=self.request.request_id,
            token_ids=self.tokens,
            logprobs=self.logprobs,
            text=self._text(tokenizer),
            finish_reason=self.finish or "length",  # type: ignore[arg-type]
            logprob_temperature=logprob_temperature(self.request.sampling.temperature),
            policy_version_first=version,
            policy_version_last=version,
            first_token_at=self.first_token_at,
        )


def _left_pad(prompts: Sequence[list[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, T]
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), mask.to(device)


def prefill(model: Any, prompts: Sequence[list[int]], pad_id: int, *, share: bool = True,
            ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over the left-padded prompts: ``(cache, logits [B, V] of each prompt's last
    token, attention mask [B, T], position of each prompt's last token [B])``.

    With ``share``, rows with the same prompt (a group's G samples) are prefilled once and the
    cache, logits and mask copied to each of them; the padded width is that of the longest
    prompt either way, so every row's cache and mask are the ones the unshared prefill gives.
    """
    from transformers import DynamicCache

    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) if share else i for i, p in enumerate(prompts)]
    unique = [list(p) for p in distinct] if share else list(prompts)
    input_ids, mask = _left_pad(unique, pad_id, model.device)  # [U, T]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, T]
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1, :]  # [U, V]
    if len(unique) < len(prompts):
        index = torch.tensor(row_of, device=model.device)  # [B]: row -> its prompt's prefill row
        cache.reorder_cache(index)  # every layer's keys and values [U, H, T, D] -> [B, H, T, D]
        logits, mask, positions = logits[index], mask[index], positions[index]
    return cache, logits, mask, positions[:, -1]


@torch.inference_mode()
def sample_batch(model: Any, tokenizer: Any, requests: Sequence[GenerationRequest], *, eos: set[int],
                 context: int, version: int, share_prefill: bool = True) -> list[Completion]:
    """Sample every request in one batched, KV-cached loop (requests must fit the context).
    ``share_prefill=False`` prefills every row on its own (the old path; for tests and the bench)."""
    device = model.device
    rows = [
        _Row(r, min(r.sampling.max_new_tokens, context - len(r.prompt_token_ids)),
             torch.Generator(device=device).manual_seed(r.seed))
        for r in requests
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    cache, logits, mask, next_position = prefill(model, [r.prompt_token_ids for r in requests], pad_id,
                                                 share=share_prefill)
    temperature = torch.tensor([r.sampling.temperature for r in requests], device=device)
    top_p = torch.tensor([r.sampling.top_p for r in requests], device=device)
    top_k = torch.tensor([r.sampling.top_k for r in requests], device=device)
    active = list(range(len(rows)))  # batch row -> index into rows
    while True:
        logprobs = processed_logprobs(logits, temperature, top_p, top_k)  # [A, V]: what is sampled
        # what is recorded: the tempered, untruncated distribution (the same as when nothing is cut)
        recorded = tempered_logprobs(logits, temperature) if truncates(top_p, top_k, logits.shape[-1]) else None
        tokens, chosen = sample_tokens(logprobs, [float(t) <= 0 for t in temperature],
                                       [rows[i].generator for i in active], recorded)
        token_list, chosen_list = tokens.tolist(), chosen.tolist()
        keep = [j for j, i in enumerate(active) if not rows[i].push(token_list[j], chosen_list[j], eos, tokenizer)]
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, tokens, next_position = mask[index], tokens[index], next_position[index]
            temperature, top_p, top_k = temperature[index], top_p[index], top_k[index]
            active = [active[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)  # [A, T+1]
        next_position = next_position + 1
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_position[:, None],
                       past_key_values=cache, use_cache=True).logits[:, -1, :]  # [A, V]
    return [row.completion(tokenizer, version) for row in rows]


def check_state_dict(model: Any, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise BackendError unless ``state_dict`` can replace every weight of ``model`` completely."""
    own = model.state_dict()
    tied = set(tied_parameter_names(model))
    missing = [k for k in own if k not in state_dict and k not in tied]
    unexpected = [k for k in state_dict if k not in own]
    if missing or unexpected:
        raise BackendError(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise BackendError(f"weight {name}: shape {tuple(tensor.shape)}, model has {tuple(own[name].shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise BackendError(f"weight {name} has non-finite values")


class PreparedWeights(dict):
    """A state dict already checked against the model and cast to its dtypes and devices."""


class TransformersBackend:
    """A local model sampled with :func:`sample_batch`; see the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, *, policy_version: int = 0, context: int | None = None,
                 share_prefill: bool = True) -> None:
        self.model = model  # its dtype is the generator's: learner weights are cast to it (prepare_weights)
        self.tokenizer = tokenizer
        self.share_prefill = share_prefill  # one prefill per distinct prompt (False: per row, as before)
        self.max_context = context or max_context(model.config)
        self._eos = eos_token_ids(model, tokenizer)
        self._version = policy_version
        self._lock = asyncio.Lock()

    @classmethod
    def load(cls, model: str, device: str = "cpu", dtype: Any = None) -> TransformersBackend:
        """``dtype``: a torch dtype or its name ("float32", "bfloat16"; default float32)."""
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        loaded, tokenizer = load_policy(model, device=device, dtype=dtype)
        return cls(loaded, tokenizer)

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        async with self._lock:
            return await asyncio.to_thread(self.generate_sync, requests)

    def generate_sync(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        version = self._version
        results: dict[int, Completion] = {}
        runnable = []
        for index, request in enumerate(requests):
            problem = prompt_too_long(request, self.max_context)
            if problem:
                results[index] = error_completion(request, problem, version)
            else:
                runnable.append(index)
        if runnable:
            try:
                done = sample_batch(self.model, self.tokenizer, [requests[i] for i in runnable], eos=self._eos,
                                    context=self.max_context, version=version, share_prefill=self.share_prefill)
            except (RuntimeError, ValueError, IndexError) as exc:
                raise BackendError(f"generation failed: {exc}") from exc
            results.update(zip(runnable, done, strict=True))
        return [results[i] for i in range(len(requests))]

    async def prepare_weights(self, state_dict: Mapping[str, torch.Tensor]) -> PreparedWeights:
        """Check and cast a state dict without the lock (while batches run), so the swap itself
        is only a copy. Raises BackendError for weights that do not fit the model."""
        return await asyncio.to_thread(self.prepare_weights_sync, state_dict)

    def prepare_weights_sync(self, state_dict: Mapping[str, torch.Tensor]) -> PreparedWeights:
        check_state_dict(self.model, state_dict)
        own = self.model.state_dict()
        return PreparedWeights({name: t.to(device=own[name].device, dtype=own[name].dtype)
                                for name, t in state_dict.items()})

    async def load_weights(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        async with self._lock:
            await asyncio.to_thread(self.load_weights_sync, version, state_dict)

    def load_weights_sync(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(state_dict, PreparedWeights):
            state_dict = self.prepare_weights_sync(state_dict)  # all checked before anything is written
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)
        self._version = version

    async def aclose(self) -> None:
        return None
