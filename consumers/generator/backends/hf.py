"""The transformers backend: a continuous, KV-cached sampling loop over a local causal LM.

Why not ``model.generate``: the behaviour log-probs must be those of the exact distribution
each token was drawn from, per row, with per-row temperature/top-p/top-k and per-row seeds.
A short loop (a prefill per admission, then one forward per token, our own sampling on the
logits, see ``sampling.py``) gives that directly, lets finished rows leave and new ones join
between two forwards (``decode.py``): a request never waits for the longest row of another.

Rows are left-padded; position ids skip the padding, so each row computes what it would alone
(up to float rounding). The prompt is prefilled once per distinct prompt (the G samples of a
group share it) and its KV cache copied to each of its rows. The model's dtype
(``generator.dtype``) is that of the whole forward; bfloat16 weights use the CPU's
AVX-512-BF16 kernels and record behaviour log-probs within 0.5 per token of float32's
(measured: max 0.39, mean 0.02, SmolLM2; see docs/generator.md). A weight swap (one asyncio
lock guards it and each iteration) comes after the whole new state dict was checked and cast
to the model's dtype, so a forward never sees a half-loaded model; ``update`` says whether rows
in progress continue under the new weights (``"in_flight"``) or the loop drains first
(``"between_batches"``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rollstream.consumers.generator.backends.base import Completion, GenerationRequest
from rollstream.consumers.generator.backends.continuous import ContinuousBackend, UpdateMode
from rollstream.consumers.generator.backends.decode import MAX_LANES, SPLIT_TOKENS, DecodeLoop, Row, new_row
from rollstream.consumers.generator.chat import eos_token_ids, max_context
from rollstream.errors import BackendError
from rollstream.models import load_policy, tied_parameter_names


def sample_batch(model: Any, tokenizer: Any, requests: Sequence[GenerationRequest], *, eos: set[int],
                 context: int, version: int, share_prefill: bool = True) -> list[Completion]:
    """Sample every request in one batch: all admitted at once, the loop run until the last row
    ends (the batching before continuous decoding; for tests and the bench). ``share_prefill=False``
    prefills every row on its own."""
    loop = DecodeLoop(model, tokenizer, eos=eos, context=context, max_rows=max(1, len(requests)),
                      share_prefill=share_prefill)
    rows = [new_row(r, context, model.device) for r in requests]
    loop.admit(rows, version)
    while len(loop):
        loop.step(version)
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


class TransformersBackend(ContinuousBackend):
    """A local model sampled by one continuous :class:`DecodeLoop` (backends/continuous.py drives
    it); see the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, *, policy_version: int = 0, context: int | None = None,
                 share_prefill: bool = True, max_rows: int = 64, max_kv_tokens: int = 1 << 20,
                 max_lanes: int = MAX_LANES, lane_split_tokens: int = SPLIT_TOKENS, prefix_cache_tokens: int = 0,
                 update: UpdateMode = "in_flight") -> None:
        super().__init__(policy_version=policy_version, update=update)
        self.model = model  # its dtype is the generator's: learner weights are cast to it (prepare_weights)
        self.tokenizer = tokenizer
        self.max_context = context or max_context(model.config)
        self.loop = DecodeLoop(model, tokenizer, eos=eos_token_ids(model, tokenizer), context=self.max_context,
                               max_rows=max_rows, max_kv_tokens=max_kv_tokens, share_prefill=share_prefill,
                               max_lanes=max_lanes, split_tokens=lane_split_tokens,
                               prefix_cache_tokens=prefix_cache_tokens, mixed_prefixes=update == "in_flight")

    @property
    def prefix_lookups(self) -> tuple[int, int]:
        """Later turns that found their previous turn's cache kept, and that did not."""
        return self.loop.prefixes.hits, self.loop.prefixes.misses

    @property
    def share_prefill(self) -> bool:
        return self.loop.share_prefill

    @classmethod
    def load(cls, model: str, device: str = "cpu", dtype: Any = None, **options: Any) -> TransformersBackend:
        """``dtype``: a torch dtype or its name ("float32", "bfloat16"; default float32);
        ``options``: the constructor's (max_rows, max_kv_tokens, max_lanes, lane_split_tokens,
        prefix_cache_tokens, update)."""
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        loaded, tokenizer = load_policy(model, device=device, dtype=dtype)
        return cls(loaded, tokenizer, **options)

    def new_row(self, request: GenerationRequest) -> Row:
        return new_row(request, self.max_context, self.model.device)

    def completion(self, row: Row) -> Completion:
        return row.completion(self.tokenizer, self._version)

    async def iterate(self, admit: list[Row], version: int) -> list[Row]:
        return await asyncio.to_thread(self._iterate, admit, version)

    def _iterate(self, admit: list[Row], version: int) -> list[Row]:
        if admit:
            self.loop.admit(admit, version)
        return self.loop.step(version)

    async def prepare(self, state_dict: Mapping[str, torch.Tensor]) -> PreparedWeights:
        return state_dict if isinstance(state_dict, PreparedWeights) else await self.prepare_weights(state_dict)

    async def swap(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        await asyncio.to_thread(self.load_weights_sync, version, state_dict)

    async def prepare_weights(self, state_dict: Mapping[str, torch.Tensor]) -> PreparedWeights:
        """Check and cast a state dict without the lock (while the loop runs), so the swap itself
        is only a copy. Raises BackendError for weights that do not fit the model."""
        return await asyncio.to_thread(self.prepare_weights_sync, state_dict)

    def prepare_weights_sync(self, state_dict: Mapping[str, torch.Tensor]) -> PreparedWeights:
        check_state_dict(self.model, state_dict)
        own = self.model.state_dict()
        return PreparedWeights({name: t.to(device=own[name].device, dtype=own[name].dtype)
                                for name, t in state_dict.items()})

    def load_weights_sync(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        if not isinstance(state_dict, PreparedWeights):
            state_dict = self.prepare_weights_sync(state_dict)  # all checked before anything is written
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)
        self._version = version
