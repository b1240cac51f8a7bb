"""The continuous decode loop of the transformers backend: rows join and leave between forwards.

One :class:`DecodeLoop` holds the rows being sampled in one or more **lanes** (:class:`_Lane`):
each lane has its rows' KV cache, attention mask, positions and the logits of their next token,
and runs one forward per iteration. An iteration (:meth:`DecodeLoop.step`) samples one token for
every row, lets the finished rows leave, and runs one forward per lane over the rest. Between two
iterations :meth:`DecodeLoop.admit` prefills new requests (once per distinct prompt, as the batch
path does) and merges their cache into a lane: both are left-padded to the same width and the new
rows written below the old ones; every row keeps its own position ids and its padding stays
masked, so a row computes what it would alone, up to float rounding (the batch shape changes the
matmuls). Columns that every remaining row masks are dropped after rows leave, so a lane is as
wide as its longest live row, not as its whole history.

**Why lanes.** Every row of a lane is left-padded to the lane's width, and each step's attention
reads the padding too. A chain's later turns carry prompts of 1-2.5k tokens while fresh groups
have 200-300: one loop for both makes every short row pay for the longest prompt at every step.
So a group of rows (one prompt's samples) joins the lane where it adds the least padded cache
(rows x width), unless a lane of its own would cost less: a forward's fixed cost (reading the
weights) is counted as ``split_tokens`` padded cache entries, measured on this machine (see
docs/generator.md). At most ``max_lanes`` lanes; ``max_lanes = 1`` is one padded loop.

**The cache is worked in place.** Each layer's keys and values live in a buffer with room to spare
(:class:`_GrowingLayer`, rows x columns): a decode step writes one column; rows that join are
written into spare rows and a wider prompt widens the lane into spare columns on the left; rows
that leave are replaced by the lane's last rows (a swap, so a leave copies the leavers' share, not
the whole cache); a trim moves the start column. transformers' ``DynamicLayer`` instead copies
the whole cache into a new tensor per layer and step, and concatenation on every join or leave
copies it again: on CPU, once long multi-turn prompts widened the loop, those copies (fresh
allocations of the cache's size, i.e. page faults) cost more than the forwards. A buffer is
reallocated, 1.5 times larger, only when a lane outgrows it.

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
from transformers.cache_utils import DynamicLayer

from rollstream.config import GeneratorConfig
from rollstream.consumers.generator.backends.base import Completion, GenerationRequest
from rollstream.consumers.generator.backends.sampling import (
    find_stop,
    logprob_temperature,
    processed_logprobs,
    sample_tokens,
    tempered_logprobs,
    truncates,
)

_DEFAULTS = GeneratorConfig()
SPLIT_TOKENS = _DEFAULTS.lane_split_tokens  # padded cache entries a forward's fixed cost is worth
MAX_LANES = _DEFAULTS.max_lanes


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
    version_first: int | None = None  # the oldest weights behind its tokens (a kept prefix's, if it used one)
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
        if self.version_first is None:  # (set at admission when its cache came from older weights)
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


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class _GrowingLayer(DynamicLayer):  # type: ignore[misc]
    """A ``DynamicLayer`` whose keys and values are views ``[:rows, :, start:end]`` of buffers with
    spare rows and columns, worked in place: ``update`` writes the new columns, ``join`` writes
    new rows (widening to the left), ``keep`` moves rows, ``trim`` moves the start column. Keys
    replaced from outside (``reorder_cache``) are copied into a new buffer at the next use."""

    _kbuf: torch.Tensor | None = None  # [row capacity, H, column capacity, D]
    _vbuf: torch.Tensor | None = None
    _view: torch.Tensor | None = None  # the keys this layer last handed out
    _rows = _start = _end = 0  # the live rows and columns

    def _publish(self) -> None:
        assert self._kbuf is not None and self._vbuf is not None
        self.keys = self._view = self._kbuf[: self._rows, :, self._start : self._end]
        self.values = self._vbuf[: self._rows, :, self._start : self._end]

    def _reserve(self, rows: int, left: int, right: int) -> None:
        """Make room for ``rows`` rows, ``left`` free columns before the live ones and ``right``
        after them; reallocates (1.5x what is needed) only when the buffer is too small or the
        keys were set from outside."""
        buf = self._kbuf
        if (buf is not None and self.keys is self._view and rows <= buf.shape[0] and left <= self._start
                and self._end + right <= buf.shape[2]):
            return
        keys, values = self.keys, self.values  # [N, H, T, D]
        used = keys.shape[2]
        shape = (rows + rows // 2, keys.shape[1], left + used + right + max(16, (left + used + right) // 2),
                 keys.shape[3])
        self._kbuf, self._vbuf = keys.new_empty(shape), values.new_empty(shape)
        self._kbuf[: keys.shape[0], :, left : left + used] = keys
        self._vbuf[: values.shape[0], :, left : left + used] = values
        self._rows, self._start, self._end = keys.shape[0], left, left + used
        self._publish()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.keys.dim() != 4:  # nothing written yet
            self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        new = key_states.shape[-2]
        self._reserve(self.keys.shape[0], 0, new)
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[: self._rows, :, self._end : self._end + new] = key_states
        self._vbuf[: self._rows, :, self._end : self._end + new] = value_states
        self._end += new
        self._publish()
        return self.keys, self.values

    def join(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write rows ``[N, H, w, D]`` below the live ones, right-aligned; the narrower side's
        columns on the left are zeros (masked, but must not be NaN)."""
        rows, added = self.keys.shape[0], keys.shape[0]
        widen = max(0, keys.shape[2] - self.keys.shape[2])
        self._reserve(rows + added, widen, 0)
        assert self._kbuf is not None and self._vbuf is not None
        if widen:
            self._kbuf[:rows, :, self._start - widen : self._start] = 0
            self._vbuf[:rows, :, self._start - widen : self._start] = 0
            self._start -= widen
        first = self._end - keys.shape[2]
        for buf, new in ((self._kbuf, keys), (self._vbuf, values)):
            buf[rows : rows + added, :, self._start : first] = 0
            buf[rows : rows + added, :, first : self._end] = new
        self._rows = rows + added
        self._publish()

    def keep(self, order: Sequence[int]) -> None:
        """Rows ``order`` (old indices) become rows 0..len-1; only the rows that move are copied."""
        self._reserve(self.keys.shape[0], 0, 0)
        assert self._kbuf is not None and self._vbuf is not None
        moves = [(new, old) for new, old in enumerate(order) if new != old]
        if moves:
            dst = torch.tensor([new for new, _ in moves], device=self._kbuf.device)
            src = torch.tensor([old for _, old in moves], device=self._kbuf.device)
            for buf in (self._kbuf, self._vbuf):
                live = buf[:, :, self._start : self._end]
                live[dst] = live[src]
        self._rows = len(order)
        self._publish()

    def trim(self, first: int) -> None:
        """Drop the first ``first`` live columns."""
        self._reserve(self.keys.shape[0], 0, 0)
        self._start += first
        self._publish()


GQA_SDPA = "rollstream_gqa_sdpa"


def _gqa_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except that grouped-query heads read their shared keys and
    values (``enable_gqa``) also under a padding mask: transformers' copies them once per head of
    the group whenever a mask is given (``repeat_kv``), which for a padded loop of SmolLM2 (3 heads
    per KV head) copied ~5 GB a decode step at 18 rows x 2000 columns and took 2 s of its 2.3."""
    batch, heads, length, size = query.shape
    groups = heads // key.shape[1]
    if length == 1 and groups > 1 and heads == groups * key.shape[1]:
        # a decode step: a group's query heads (h // groups reads KV head h, as repeat_kv pairs them)
        # taken as that KV head's query positions: one plain attention over the shared keys, the
        # padding mask [B, 1, 1, T] broadcast over them; ~30 % faster on CPU than enable_gqa
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(batch, key.shape[1], groups, size), key, value, attn_mask=attention_mask, dropout_p=dropout,
            scale=scaling)
        return out.reshape(batch, 1, heads, size), None
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    causal = bool(length > 1 and attention_mask is None and causal)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=heads != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def gqa_attention(model: Any) -> None:
    """Switch a model that uses transformers' sdpa attention to :func:`_gqa_sdpa` (the same
    attention, computed without copying the keys and values per query head); others keep theirs."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GQA_SDPA, _gqa_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GQA_SDPA, sdpa_mask)  # the masks sdpa gets
    model.set_attn_implementation(GQA_SDPA)


def growing_cache(config: Any) -> Any:
    """A DynamicCache for ``config`` whose full-attention layers are :class:`_GrowingLayer`s
    (sliding-window layers keep theirs: the loop treats them by concatenation, see :class:`_Lane`)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = _GrowingLayer
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


def prefill_after(model: Any, prefix: Sequence[tuple[torch.Tensor, torch.Tensor]], suffix: Sequence[int],
                  ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`prefill` of one row whose prompt starts with a prefix already computed (its keys and
    values per layer, ``[1, H, P, D]``): only ``suffix`` is run through the model."""
    cache = growing_cache(model.config)
    for layer, (keys, values) in zip(cache.layers, prefix, strict=True):
        layer.update(keys, values)
    done = prefix[0][0].shape[2]
    mask = torch.ones((1, done + len(suffix)), dtype=torch.long, device=model.device)
    positions = torch.arange(done, done + len(suffix), device=model.device)[None]
    logits = model(input_ids=torch.tensor([list(suffix)], device=model.device), attention_mask=mask,
                   position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
    return cache, logits, mask, positions[:, -1]


@dataclass
class _Prefix:
    tokens: tuple[int, ...]  # what the keys and values were computed over
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, H, len(tokens), D]
    version_first: int  # the oldest weights that computed any of them
    version_last: int  # and the newest


class PrefixCache:
    """The cache of rows that finished, kept for their episode's next turn.

    A multi-turn episode's next turn is prompted with the previous prompt, the tokens the model
    generated and the sandbox's observation, token for token (consumers/generator/turns.py
    ``continued``), so the previous row's keys and values are the new prompt's prefix: the
    continuation runs only the observation through the model instead of the whole conversation
    (1-2.5k tokens in the learning recipe's chains). Only rows whose episode may go on are kept
    (``GenerationRequest.more_turns``). Each entry is used once (the next turn keeps the longer
    one); the oldest go first beyond ``max_tokens`` columns (0: off).

    Versions: with ``mixed`` (``generator.update = "in_flight"``), a prefix computed by older
    weights is used under newer ones, exactly as a row in flight keeps its cache across a swap:
    each token's log-prob is that of the distribution it was drawn from, and the row records the
    prefix's oldest version as its first (the episode spans it already: its earlier turns did).
    Without it (``"between_batches"``, where no row spans two versions), an entry is kept only
    when one version computed all of it and used only under that version.
    """

    def __init__(self, max_tokens: int, *, mixed: bool = False) -> None:
        self.max_tokens = max_tokens
        self.mixed = mixed
        self.entries: dict[int, _Prefix] = {}  # insertion order: oldest first
        self.tokens = 0
        self.hits = self.misses = 0  # lookups of later turns (turn > 1) that found their prefix or not

    def keep(self, row: Row, kv: list[tuple[torch.Tensor, torch.Tensor]], columns: int) -> None:
        """Keep a finished ``row``'s last ``columns`` columns of ``kv`` (its rows of every layer)."""
        tokens = (*row.request.prompt_token_ids, *row.tokens[:-1])  # the last token was never fed
        first, last = row.version_first, row.version_last
        if (not row.request.more_turns or first is None or last is None or (first != last and not self.mixed)
                or len(tokens) != columns or not tokens or columns > self.max_tokens):
            return
        entry = _Prefix(tokens, [(k[:, :, -columns:].clone(), v[:, :, -columns:].clone()) for k, v in kv],
                        first, last)
        self.entries[id(entry)] = entry
        self.tokens += columns
        while self.tokens > self.max_tokens:
            self._drop(next(iter(self.entries)))

    def take(self, request: GenerationRequest, version: int) -> _Prefix | None:
        """The longest kept prefix of ``request``'s prompt usable under weights ``version``
        (removed), if any; entries that never will be are dropped."""
        prompt = request.prompt_token_ids
        best = None
        for key, entry in list(self.entries.items()):
            if entry.version_last > version or (entry.version_last != version and not self.mixed):
                self._drop(key)
            elif (len(entry.tokens) < len(prompt) and (best is None or len(entry.tokens) > len(best.tokens))
                  and tuple(prompt[: len(entry.tokens)]) == entry.tokens):
                best = entry
        if best is not None:
            self._drop(id(best))
        if request.turn > 1:
            self.hits += best is not None
            self.misses += best is None
        return best

    def _drop(self, key: int) -> None:
        self.tokens -= len(self.entries.pop(key).tokens)


class _Lane:
    """Rows decoded by one forward per iteration: their cache, mask, positions, next-token logits
    and sampling settings, all in batch order."""

    def __init__(self, rows: list[Row], cache: Any, logits: torch.Tensor, mask: torch.Tensor,
                 position: torch.Tensor, version: int) -> None:
        device = logits.device
        self.rows = rows
        self.cache = cache
        self.logits = logits  # [A, V]: of each row's next token
        self.mask = mask  # [A, T]
        self.position = position  # [A]: position of each row's last fed token
        self.versions = [version] * len(rows)  # [A]: the weights that computed each row's logits
        self.temperature = torch.tensor([r.request.sampling.temperature for r in rows], device=device)
        self.top_p = torch.tensor([r.request.sampling.top_p for r in rows], device=device)
        self.top_k = torch.tensor([r.request.sampling.top_k for r in rows], device=device)

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    @property
    def reserved(self) -> int:
        return max(r.reserved for r in self.rows)

    def join(self, other: _Lane) -> None:
        """Take ``other``'s rows (freshly prefilled) below this lane's."""
        width = max(self.width, other.width)
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            if isinstance(mine, _GrowingLayer):
                mine.join(theirs.keys, theirs.values)
            else:  # a layer of another kind (sliding window): by concatenation
                mine.keys = torch.cat([_pad_left(mine.keys, width, 2), _pad_left(theirs.keys, width, 2)])
                mine.values = torch.cat([_pad_left(mine.values, width, 2), _pad_left(theirs.values, width, 2)])
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(other.mask, width, 1)])
        self.logits = torch.cat([self.logits, other.logits.to(self.logits.dtype)])
        self.position = torch.cat([self.position, other.position])
        self.temperature = torch.cat([self.temperature, other.temperature])
        self.top_p = torch.cat([self.top_p, other.top_p])
        self.top_k = torch.cat([self.top_k, other.top_k])
        self.rows = self.rows + other.rows
        self.versions = self.versions + other.versions

    def keep(self, kept: list[int]) -> torch.Tensor:
        """Keep the rows ``kept`` (ascending indices): the last kept rows fill the gaps the others
        leave, so only they are copied. Returns the new order (old index of each row)."""
        count, kept_set = len(kept), set(kept)
        order = list(range(count))
        holes = (j for j in range(count) if j not in kept_set)
        for hole, source in zip(holes, [j for j in kept if j >= count], strict=True):
            order[hole] = source
        index = torch.tensor(order, device=self.mask.device)
        for layer in self.cache.layers:
            if isinstance(layer, _GrowingLayer):
                layer.keep(order)
            else:
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.mask, self.position, self.logits = self.mask[index], self.position[index], self.logits[index]
        self.temperature, self.top_p, self.top_k = self.temperature[index], self.top_p[index], self.top_k[index]
        self.rows = [self.rows[j] for j in order]
        self.versions = [self.versions[j] for j in order]
        self._trim()
        return index

    def _trim(self) -> None:
        """Drop the leading columns that every live row masks (they were the rows that left)."""
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0, 0]) if len(used) else 0
        if first > 0:
            self.mask = self.mask[:, first:]
            for layer in self.cache.layers:
                if isinstance(layer, _GrowingLayer):
                    layer.trim(first)
                else:
                    layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def step(self, model: Any, version: int, eos: set[int], tokenizer: Any,
             store: PrefixCache | None = None) -> list[Row]:
        """Sample one token per row, let finished (and abandoned) rows leave (the finished ones'
        cache kept in ``store``), run one forward over the rest. Returns the rows that left."""
        logprobs = processed_logprobs(self.logits, self.temperature, self.top_p, self.top_k)  # [A, V]
        # what is recorded: the tempered, untruncated distribution (the same as when nothing is cut)
        recorded = (tempered_logprobs(self.logits, self.temperature)
                    if truncates(self.top_p, self.top_k, self.logits.shape[-1]) else None)
        tokens, chosen = sample_tokens(logprobs, [float(t) <= 0 for t in self.temperature],
                                       [r.generator for r in self.rows], recorded)
        token_list, chosen_list = tokens.tolist(), chosen.tolist()
        kept, left = [], []
        for j, row in enumerate(self.rows):
            if row.abandoned:
                left.append(row)
            elif row.push(token_list[j], chosen_list[j], eos, tokenizer, self.versions[j]):
                left.append(row)
                if store is not None:  # finished: its cache kept for its episode's next turn
                    store.keep(row, [(layer.keys[j : j + 1], layer.values[j : j + 1]) for layer in self.cache.layers],
                               int(self.mask[j].sum()))
            else:
                kept.append(j)
        if not kept:
            self.rows = []
            return left
        if len(kept) < len(self.rows):
            tokens = tokens[self.keep(kept)]
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)  # [A, T+1]
        self.position = self.position + 1
        self.logits = model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.position[:, None],
                            past_key_values=self.cache, use_cache=True).logits[:, -1, :]  # [A, V]
        self.versions = [version] * len(self.rows)
        return left


class DecodeLoop:
    """See the module docstring. Not thread-safe: one thread calls everything."""

    def __init__(self, model: Any, tokenizer: Any, *, eos: set[int], context: int, max_rows: int = 64,
                 max_kv_tokens: int = 1 << 20, share_prefill: bool = True, max_lanes: int = MAX_LANES,
                 split_tokens: int = SPLIT_TOKENS, prefix_cache_tokens: int = 0, mixed_prefixes: bool = False,
                 ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos = eos
        self.context = context
        self.max_rows = max_rows
        self.max_kv_tokens = max_kv_tokens
        self.share_prefill = share_prefill
        self.max_lanes = max_lanes
        self.split_tokens = split_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.forwards = 0  # decode forwards run (prefills not counted)
        self.lanes: list[_Lane] = []
        self.prefixes = PrefixCache(prefix_cache_tokens, mixed=mixed_prefixes)
        self.prefilled_tokens = 0  # prompt tokens run through the model at admission (prefix hits skip theirs)
        gqa_attention(model)

    def __len__(self) -> int:
        return sum(len(lane.rows) for lane in self.lanes)

    @property
    def rows(self) -> list[Row]:
        return [row for lane in self.lanes for row in lane.rows]

    @property
    def width(self) -> int:
        """The widest lane's columns."""
        return max((lane.width for lane in self.lanes), default=0)

    def _plan(self, rows: Sequence[Row]) -> list[tuple[int, int, list[Row]]]:
        """Where ``rows`` would join: per lane (the existing ones, then new ones), its rows and
        reserved width after the join, and the rows joining it. A group (rows of one prompt) joins
        the lane it adds the least padded cache to (rows x width: its own rows padded to the lane,
        or the lane's padded to them), unless a lane of its own costs less, a new lane's forward
        counted as ``split_tokens``."""
        lanes = [[len(lane.rows), lane.width, lane.reserved, []] for lane in self.lanes]
        groups: dict[tuple[int, ...], list[Row]] = {}
        for row in rows:
            groups.setdefault(tuple(row.request.prompt_token_ids), []).append(row)
        for prompt, group in groups.items():
            count, width = len(group), len(prompt)
            best, cost = None, (self.split_tokens + count * width if len(lanes) < self.max_lanes else float("inf"))
            for i, (live, lane_width, _, _) in enumerate(lanes):
                added = (live + count) * max(lane_width, width) - live * lane_width
                if added <= cost:
                    best, cost = i, added
            if best is None:
                lanes.append([count, width, max(r.reserved for r in group), list(group)])
            else:
                lane = lanes[best]
                lane[0], lane[1] = lane[0] + count, max(lane[1], width)
                lane[2] = max(lane[2], *(r.reserved for r in group))
                lane[3].extend(group)
        return [(live, reserved, joining) for live, _, reserved, joining in lanes]

    def fits(self, rows: Sequence[Row]) -> bool:
        """Whether ``rows`` can join now: at most max_rows rows, and the lanes' rows x their widest
        reserved row within max_kv_tokens (one row always fits an empty loop)."""
        live = len(self) + len(rows)
        if live <= 1:
            return True
        if live > self.max_rows:
            return False
        return sum(count * reserved for count, reserved, _ in self._plan(rows)) <= self.max_kv_tokens

    def abandon(self) -> list[Row]:
        """Drop every row (after a failure, or to stop); returns them."""
        rows = self.rows
        self.lanes = []
        return rows

    @torch.inference_mode()
    def admit(self, rows: Sequence[Row], version: int) -> None:
        """Prefill ``rows`` with the loaded weights (``version``) and merge them into the lanes
        :meth:`_plan` chooses (one prefill forward per lane joined)."""
        for i, (_, _, joining) in enumerate(self._plan(rows)):
            parts: list[_Lane] = []
            fresh = []
            for row in joining:
                hit = self.prefixes.take(row.request, version)
                if hit is None:
                    fresh.append(row)
                    continue
                row.version_first = hit.version_first
                prompt = row.request.prompt_token_ids
                self.prefilled_tokens += len(prompt) - len(hit.tokens)
                parts.append(_Lane([row], *prefill_after(self.model, hit.kv, prompt[len(hit.tokens):]), version))
            if fresh:
                prompts = [r.request.prompt_token_ids for r in fresh]
                prefills = len({tuple(p) for p in prompts}) if self.share_prefill else len(prompts)
                self.prefilled_tokens += prefills * max(len(p) for p in prompts)
                parts.append(_Lane(fresh, *prefill(self.model, prompts, self.pad_id, share=self.share_prefill),
                                   version))
            for lane in parts:
                if i < len(self.lanes):
                    self.lanes[i].join(lane)
                else:
                    self.lanes.append(lane)

    @torch.inference_mode()
    def step(self, version: int) -> list[Row]:
        """Sample one token per row, let finished (and abandoned) rows leave, run one forward per
        lane over the rest with the loaded weights (``version``). Returns the rows that left."""
        left: list[Row] = []
        store = self.prefixes if self.prefixes.max_tokens else None
        for lane in self.lanes:
            left.extend(lane.step(self.model, version, self.eos, self.tokenizer, store))
            self.forwards += bool(lane.rows)
        self.lanes = [lane for lane in self.lanes if lane.rows]
        return left
