"""The continuous decode loop of the transformers backend: rows join and leave between forwards.

One :class:`DecodeLoop` holds the rows being sampled, their KV cache, attention mask, positions
and the logits of their next token. An iteration (:meth:`DecodeLoop.step`) samples one token for
every row, lets the finished rows leave, and runs one forward over the rest. Between two
iterations :meth:`DecodeLoop.admit` prefills new requests (once per distinct prompt, as the
batch path does) and merges their cache into the running one: both caches are left-padded to
the same width and concatenated along the batch; every row keeps its own position ids and its
padding stays masked, so a row computes what it would alone, up to float rounding (the batch
shape changes the matmuls). Columns that every remaining row masks are trimmed after rows
leave, so the cache is as wide as the longest live row, not as the loop's whole history.

The cache grows in place: each layer's keys and values live in a buffer with room to spare
(:class:`_GrowingLayer`), so a decode step writes one column instead of copying the whole cache
into a new tensor, as transformers' ``DynamicLayer`` does (on CPU that copy, a fresh allocation of
the cache's size per layer and step, cost more than the forward once long multi-turn prompts
widened the loop: the kernel's page faults kept a core at 100 % system time). A buffer is
reallocated, 1.5 times larger, only when the loop outgrows it or rows join, leave or are trimmed.

Bounds: at most ``max_rows`` rows, and ``rows x width <= max_kv_tokens``, where a row's width is
reserved up front (its prompt plus its token limit) so that a row admitted never has to be
evicted; a request that does not fit waits (:meth:`fits`), and one request alone always fits.

Versions: the logits of each row carry the version of the weights that computed them, and a
sampled token records that version, so when weights are swapped between two iterations
(``generator.update = "in_flight"``) a row's first and last versions say which weights it
spans, and each token's log-prob is that of the distribution it was actually drawn from: the
prefix's cache from the old weights, the forwards after the swap from the new.

Pure torch, no asyncio: the backend drives it from one worker thread (backends/hf.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rollstream.consumers.generator.backends.base import Completion, GenerationRequest
from rollstream.consumers.generator.backends.sampling import (
    find_stop,
    logprob_temperature,
    processed_logprobs,
    sample_tokens,
    tempered_logprobs,
    truncates,
)


@dataclass
class Row:
    """Bookkeeping of one request while its tokens are sampled."""

    request: GenerationRequest
    limit: int  # most new tokens: max_new_tokens, cut to what the context allows
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    first_token_at: float | None = None
    version_first: int | None = None  # the weights of its first sampled token
    version_last: int | None = None  # and of its last
    abandoned: bool = False  # its caller is gone: dropped at the next iteration

    @property
    def reserved(self) -> int:
        """The most cache columns the row can ever need."""
        return len(self.request.prompt_token_ids) + self.limit

    def push(self, token: int, logprob: float, eos: set[int], tokenizer: Any, version: int = 0) -> bool:
        """Record a sampled token (drawn from logits of weights ``version``); True when finished."""
        if self.first_token_at is None:
            self.first_token_at = time.time()
            self.version_first = version
        self.version_last = version
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
        """``version``: the loaded weights', for a row that sampled nothing."""
        return Completion(
            request_id=self.request.request_id,
            token_ids=self.tokens,
            logprobs=self.logprobs,
            text=self._text(tokenizer),
            finish_reason=self.finish or "length",  # type: ignore[arg-type]
            logprob_temperature=logprob_temperature(self.request.sampling.temperature),
            policy_version_first=version if self.version_first is None else self.version_first,
            policy_version_last=version if self.version_last is None else self.version_last,
            first_token_at=self.first_token_at,
        )


def new_row(request: GenerationRequest, context: int, device: Any) -> Row:
    return Row(request, min(request.sampling.max_new_tokens, context - len(request.prompt_token_ids)),
               torch.Generator(device=device).manual_seed(request.seed))


def _left_pad(prompts: Sequence[list[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, T]
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), mask.to(device)


def _growing_layer_class() -> type | None:
    """transformers' ``DynamicLayer`` whose ``update`` writes into a buffer with room to spare (None
    where the cache has no layer objects: transformers < 4.56 keeps two lists)."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None

    class _GrowingLayer(DynamicLayer):  # type: ignore[misc, valid-type]
        _kbuf: torch.Tensor | None = None
        _vbuf: torch.Tensor | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            if self.keys.numel() == 0:
                used, kept = 0, None
            else:
                used, kept = self.keys.shape[-2], (self.keys, self.values)
            need = used + key_states.shape[-2]
            buf = self._kbuf
            if (buf is None or kept is None or buf.shape[0] != key_states.shape[0] or need > buf.shape[-2]
                    or self.keys.data_ptr() != buf.data_ptr() or self.keys.stride() != buf.stride()):
                # the cache was replaced (rows joined, left or were trimmed) or is full: a new buffer
                shape = (*key_states.shape[:-2], need + max(16, need // 2), key_states.shape[-1])
                self._kbuf, self._vbuf = key_states.new_empty(shape), value_states.new_empty(shape)
                if kept is not None:
                    self._kbuf[..., :used, :] = kept[0]
                    self._vbuf[..., :used, :] = kept[1]
            assert self._kbuf is not None and self._vbuf is not None
            self._kbuf[..., used:need, :] = key_states
            self._vbuf[..., used:need, :] = value_states
            self.keys, self.values = self._kbuf[..., :need, :], self._vbuf[..., :need, :]
            return self.keys, self.values

    return _GrowingLayer


_GROWING = _growing_layer_class()


def growing_cache(config: Any) -> Any:
    """A DynamicCache for ``config`` whose full-attention layers grow in place (:class:`_GrowingLayer`)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    if _GROWING is not None:
        for layer in getattr(cache, "layers", []):
            if type(layer) is _GROWING.__base__:  # exactly DynamicLayer (sliding-window layers keep theirs)
                layer.__class__ = _GROWING
    return cache


def prefill(model: Any, prompts: Sequence[list[int]], pad_id: int, *, share: bool = True,
            ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward over the left-padded prompts: ``(cache, logits [B, V] of each prompt's last
    token, attention mask [B, T], position of each prompt's last token [B])``.

    With ``share``, rows with the same prompt (a group's G samples) are prefilled once and the
    cache, logits and mask copied to each of them; the padded width is that of the longest
    prompt either way, so every row's cache and mask are the ones the unshared prefill gives.
    """
    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) if share else i for i, p in enumerate(prompts)]
    unique = [list(p) for p in distinct] if share else list(prompts)
    input_ids, mask = _left_pad(unique, pad_id, model.device)  # [U, T]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, T]
    cache = growing_cache(model.config)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1, :]  # [U, V]
    if len(unique) < len(prompts):
        index = torch.tensor(row_of, device=model.device)  # [B]: row -> its prompt's prefill row
        cache.reorder_cache(index)  # every layer's keys and values [U, H, T, D] -> [B, H, T, D]
        logits, mask, positions = logits[index], mask[index], positions[index]
    return cache, logits, mask, positions[:, -1]


class _Layers:
    """The keys and values of every layer of a DynamicCache, read and written in place
    (transformers >= 4.56 keeps them in ``cache.layers``, earlier versions in two lists)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def get(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if hasattr(self.cache, "layers"):
            return [(layer.keys, layer.values) for layer in self.cache.layers]
        return list(zip(self.cache.key_cache, self.cache.value_cache, strict=True))

    def set(self, kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if hasattr(self.cache, "layers"):
            for layer, (keys, values) in zip(self.cache.layers, kv, strict=True):
                layer.keys, layer.values = keys, values
        else:
            self.cache.key_cache[:] = [k for k, _ in kv]
            self.cache.value_cache[:] = [v for _, v in kv]


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class DecodeLoop:
    """See the module docstring. Not thread-safe: one thread calls everything."""

    def __init__(self, model: Any, tokenizer: Any, *, eos: set[int], context: int, max_rows: int = 64,
                 max_kv_tokens: int = 1 << 20, share_prefill: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos = eos
        self.context = context
        self.max_rows = max_rows
        self.max_kv_tokens = max_kv_tokens
        self.share_prefill = share_prefill
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.forwards = 0  # decode forwards run (prefills not counted)
        self._reset()

    def _reset(self) -> None:
        self.rows: list[Row] = []  # batch order
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [A, T]
        self.position: torch.Tensor | None = None  # [A]: position of each row's last fed token
        self.logits: torch.Tensor | None = None  # [A, V]: of each row's next token
        self.versions: list[int] = []  # [A]: the weights that computed each row's logits
        self.temperature = self.top_p = self.top_k = None  # [A] each

    def __len__(self) -> int:
        return len(self.rows)

    def fits(self, rows: Sequence[Row]) -> bool:
        """Whether ``rows`` can join now within max_rows and max_kv_tokens (one row always fits an
        empty loop)."""
        live = self.rows + list(rows)
        if len(live) <= 1:
            return True
        return len(live) <= self.max_rows and len(live) * max(r.reserved for r in live) <= self.max_kv_tokens

    def abandon(self) -> list[Row]:
        """Drop every row (after a failure, or to stop); returns them."""
        rows = self.rows
        self._reset()
        return rows

    @torch.inference_mode()
    def admit(self, rows: Sequence[Row], version: int) -> None:
        """Prefill ``rows`` with the loaded weights (``version``) and merge them into the loop."""
        if not rows:
            return
        cache, logits, mask, position = prefill(self.model, [r.request.prompt_token_ids for r in rows],
                                                self.pad_id, share=self.share_prefill)
        device = self.model.device
        temperature = torch.tensor([r.request.sampling.temperature for r in rows], device=device)
        top_p = torch.tensor([r.request.sampling.top_p for r in rows], device=device)
        top_k = torch.tensor([r.request.sampling.top_k for r in rows], device=device)
        if not self.rows:
            self.cache, self.logits, self.mask, self.position = cache, logits, mask, position
            self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        else:
            assert self.mask is not None and self.logits is not None and self.position is not None
            width = max(self.mask.shape[1], mask.shape[1])
            old, new = _Layers(self.cache), _Layers(cache)
            old.set([(torch.cat([_pad_left(k0, width, 2), _pad_left(k1, width, 2)]),
                      torch.cat([_pad_left(v0, width, 2), _pad_left(v1, width, 2)]))
                     for (k0, v0), (k1, v1) in zip(old.get(), new.get(), strict=True)])
            self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)])
            self.logits = torch.cat([self.logits, logits.to(self.logits.dtype)])
            self.position = torch.cat([self.position, position])
            self.temperature = torch.cat([self.temperature, temperature])
            self.top_p = torch.cat([self.top_p, top_p])
            self.top_k = torch.cat([self.top_k, top_k])
        self.rows = self.rows + list(rows)
        self.versions = self.versions + [version] * len(rows)

    @torch.inference_mode()
    def step(self, version: int) -> list[Row]:
        """Sample one token per row, let finished (and abandoned) rows leave, run one forward over
        the rest with the loaded weights (``version``). Returns the rows that left."""
        if not self.rows:
            return []
        assert self.logits is not None and self.mask is not None and self.position is not None
        logprobs = processed_logprobs(self.logits, self.temperature, self.top_p, self.top_k)  # [A, V]
        # what is recorded: the tempered, untruncated distribution (the same as when nothing is cut)
        recorded = (tempered_logprobs(self.logits, self.temperature)
                    if truncates(self.top_p, self.top_k, self.logits.shape[-1]) else None)
        tokens, chosen = sample_tokens(logprobs, [float(t) <= 0 for t in self.temperature],
                                       [r.generator for r in self.rows], recorded)
        token_list, chosen_list = tokens.tolist(), chosen.tolist()
        keep, left = [], []
        for j, row in enumerate(self.rows):
            if row.abandoned or row.push(token_list[j], chosen_list[j], self.eos, self.tokenizer, self.versions[j]):
                left.append(row)
            else:
                keep.append(j)
        if not keep:
            self._reset()
            return left
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, device=self.model.device)
            self.cache.batch_select_indices(index)
            self.mask, tokens, self.position = self.mask[index], tokens[index], self.position[index]
            self.temperature, self.top_p, self.top_k = self.temperature[index], self.top_p[index], self.top_k[index]
            self.rows = [self.rows[j] for j in keep]
            self._trim()
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)  # [A, T+1]
        self.position = self.position + 1
        self.logits = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                                 position_ids=self.position[:, None], past_key_values=self.cache,
                                 use_cache=True).logits[:, -1, :]  # [A, V]
        self.versions = [version] * len(self.rows)
        self.forwards += 1
        return left

    def _trim(self) -> None:
        """Drop the leading columns that every live row masks (they were the rows that left)."""
        assert self.mask is not None
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0, 0]) if len(used) else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            layers = _Layers(self.cache)
            layers.set([(k[:, :, first:], v[:, :, first:]) for k, v in layers.get()])

    @property
    def width(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])
