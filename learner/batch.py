"""From advantaged groups to padded training tensors; staleness filtering.

Pure functions, no I/O. Consumes ``GroupAdvantaged`` events (their ``AdvantagedRollout`` s),
produces :class:`Batch` es of right-padded [B, T] tensors over prompt + completion.

Staleness uses ``Rollout.policy_version_first``: the version of the weights that produced the
rollout's *first* token. It is the oldest policy any token of the rollout came from (a generator
may swap weights mid-completion, so ``policy_version_last`` can be newer), so bounding it bounds
the lag of every token; it is what AReaL's eta bounds. A rollout is stale when
``current_version - policy_version_first > max_staleness`` (``rollstream.weights.versions_past``,
the one staleness rule) and is dropped and counted.
A rollout from a *newer* version than the learner's (possible only after a resume, from a dead
lineage's weights) is not stale: its behaviour log-probs are recorded, so the IS weight corrects it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import torch

from rollstream.learner.domains import loss_weights
from rollstream.schemas.arrays import PackedArray
from rollstream.schemas.events import AdvantagedRollout, GroupAdvantaged
from rollstream.weights import versions_past

_TORCH_OF = {"i": torch.int32, "f": torch.float32, "B": torch.uint8}  # array typecode -> dtype


@dataclass(frozen=True)
class Batch:
    """Right-padded tensors of B rollouts; every [B, T] tensor is aligned with ``input_ids``."""

    input_ids: torch.Tensor  # [B, T] long, prompt + completion, padded with pad_id
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor  # [B, T] float, 1 on generated completion tokens
    behaviour_logprobs: torch.Tensor  # [B, T] float, log mu of each generated token (0 elsewhere)
    advantages: torch.Tensor  # [B] float
    temperatures: torch.Tensor  # [B] float, the rollouts' logprob_temperature (0 -> 1)
    rollout_ids: tuple[str, ...]
    weights: torch.Tensor | None = None  # [B] float, each rollout's weight in the loss (family x domain); None: 1

    @property
    def num_tokens(self) -> int:
        """Generated (trained) tokens."""
        return int(self.loss_mask.sum())

    def to(self, device: str | torch.device) -> Batch:
        return Batch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            advantages=self.advantages.to(device),
            temperatures=self.temperatures.to(device),
            rollout_ids=self.rollout_ids,
            weights=self.weights.to(device) if self.weights is not None else None,
        )


@dataclass
class Selection:
    """The rollouts of a step that will be trained, and what was dropped."""

    rollouts: list[AdvantagedRollout] = field(default_factory=list)
    stale: int = 0  # rollouts dropped for staleness
    empty: int = 0  # rollouts dropped for having no generated token
    lags: list[int] = field(default_factory=list)  # current_version - policy_version_first, every rollout


def staleness(current_version: int, rollout: AdvantagedRollout) -> int:
    return current_version - rollout.rollout.policy_version_first


def select_rollouts(
    groups: Iterable[GroupAdvantaged], current_version: int, max_staleness: int
) -> Selection:
    """Keep the rollouts that are fresh enough and have something to train on."""
    selection = Selection()
    for group in groups:
        for item in group.rollouts:
            lag = staleness(current_version, item)
            selection.lags.append(lag)
            if versions_past(current_version, item.rollout.policy_version_first, max_staleness):
                selection.stale += 1
            elif not any(generated_mask(item)):
                selection.empty += 1
            else:
                selection.rollouts.append(item)
    return selection


def generated_mask(item: AdvantagedRollout) -> list[int]:
    rollout = item.rollout
    if rollout.generated_mask is None:  # one-shot: every completion token was generated
        return [1] * len(rollout.completion_token_ids)
    return list(rollout.generated_mask)


def _tensor(values: PackedArray, dtype: torch.dtype) -> torch.Tensor:
    """A packed array of an event as a tensor of ``dtype`` (read through its buffer, no per-item work)."""
    if not len(values):
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(values, dtype=_TORCH_OF[values.typecode]).to(dtype)


def collate(items: Sequence[AdvantagedRollout], pad_id: int = 0,
            family_weights: Mapping[str, float] | None = None,
            domain_weights: Mapping[str, float] | None = None) -> Batch:
    """Pad ``items`` to the longest prompt + completion of the batch; ``family_weights`` and
    ``domain_weights``: each rollout's weight in the loss is its task family's times its domain's
    (not named: 1; learner/domains.py ``loss_weights``)."""
    if not items:
        raise ValueError("cannot collate an empty batch")
    lengths = [len(i.rollout.prompt_token_ids) + len(i.rollout.completion_token_ids) for i in items]
    batch, width = len(items), max(lengths)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width), dtype=torch.float32)
    behaviour = torch.zeros((batch, width), dtype=torch.float32)
    for row, item in enumerate(items):
        rollout = item.rollout
        start = len(rollout.prompt_token_ids)
        end = start + len(rollout.completion_token_ids)
        input_ids[row, :start] = _tensor(rollout.prompt_token_ids, torch.long)
        input_ids[row, start:end] = _tensor(rollout.completion_token_ids, torch.long)
        attention[row, :end] = 1
        if rollout.generated_mask is None:  # one-shot: every completion token was generated
            loss_mask[row, start:end] = 1.0
        else:
            loss_mask[row, start:end] = _tensor(rollout.generated_mask, torch.float32)
        behaviour[row, start:end] = _tensor(rollout.behaviour_logprobs, torch.float32)
    behaviour = behaviour * loss_mask  # observation tokens carry no behaviour log-prob
    temps = [i.rollout.logprob_temperature or 1.0 for i in items]
    weights = loss_weights(items, family_weights, domain_weights)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour,
        advantages=torch.tensor([i.advantage for i in items], dtype=torch.float32),
        temperatures=torch.tensor(temps, dtype=torch.float32),
        rollout_ids=tuple(i.rollout.rollout_id for i in items),
        weights=torch.tensor(weights, dtype=torch.float32) if weights is not None else None,
    )


def micro_batches(items: Sequence[AdvantagedRollout], micro_batch: int, pad_id: int = 0,
                  family_weights: Mapping[str, float] | None = None,
                  domain_weights: Mapping[str, float] | None = None) -> list[Batch]:
    """Split ``items`` into padded batches of at most ``micro_batch`` rollouts.

    Rollouts are sorted by length first so each micro-batch pads little; the order inside a
    step does not change its gradient (the losses are summed with step-wide denominators).
    """
    ordered = sorted(items, key=lambda i: len(i.rollout.prompt_token_ids) + len(i.rollout.completion_token_ids))
    return [collate(ordered[i : i + micro_batch], pad_id, family_weights, domain_weights)
            for i in range(0, len(ordered), micro_batch)]


def group_micro_batches(items: Sequence[AdvantagedRollout], micro_batch: int, pad_id: int = 0,
                        family_weights: Mapping[str, float] | None = None,
                        domain_weights: Mapping[str, float] | None = None) -> list[Batch]:
    """Like :func:`micro_batches`, but each micro-batch holds rollouts of one group only (so they
    share their prompt; learner.prefix_sharing), sorted by length inside the group."""
    groups: dict[str, list[AdvantagedRollout]] = {}
    for item in items:
        groups.setdefault(item.rollout.group_id, []).append(item)
    return [batch for members in groups.values()
            for batch in micro_batches(members, micro_batch, pad_id, family_weights, domain_weights)]


# --- a step across ranks -------------------------------------------------------------------------


class UpdatePlan(msgspec.Struct, frozen=True, kw_only=True):
    """One optimizer update of a step, split across the ranks (rank 0 sends it to the others).

    ``tokens`` and ``sequences`` are the whole update's (every rank's) generated tokens and
    rollouts with one: the loss's denominators, so the ranks' summed gradients are exactly the
    one-rank gradient. ``micro_batches`` is the most any rank needs; each rank runs that many."""

    shares: list[list[AdvantagedRollout]]  # [rank] -> that rank's rollouts
    tokens: int
    sequences: int
    micro_batches: int


def rollout_length(item: AdvantagedRollout) -> int:
    """Tokens a forward pass of the rollout processes (prompt + completion)."""
    return len(item.rollout.prompt_token_ids) + len(item.rollout.completion_token_ids)


def split_by_tokens(items: Sequence[AdvantagedRollout], ranks: int) -> list[list[AdvantagedRollout]]:
    """``items`` shared among ``ranks`` with balanced token counts: the longest first, each to the
    rank holding the fewest tokens so far (the lowest rank on ties). Deterministic."""
    shares: list[list[AdvantagedRollout]] = [[] for _ in range(ranks)]
    held = [0] * ranks
    for item in sorted(items, key=rollout_length, reverse=True):
        rank = min(range(ranks), key=lambda r: (held[r], r))
        shares[rank].append(item)
        held[rank] += rollout_length(item)
    return shares


def plan_step(items: Sequence[AdvantagedRollout], updates_per_step: int, micro_batch: int,
              ranks: int) -> list[UpdatePlan]:
    """A step's rollouts as ``updates_per_step`` updates (every n-th rollout, as one rank always
    split them), each shared among ``ranks`` by tokens."""
    n_updates = max(1, min(updates_per_step, len(items)))
    plans = []
    for chunk in ([items[i] for i in range(u, len(items), n_updates)] for u in range(n_updates)):
        shares = split_by_tokens(chunk, ranks) if ranks > 1 else [list(chunk)]
        tokens = [sum(generated_mask(item)) for item in chunk]
        plans.append(UpdatePlan(shares=shares, tokens=sum(tokens), sequences=sum(t > 0 for t in tokens),
                                micro_batches=max(-(-len(share) // micro_batch) for share in shares)))
    return plans


def idle_batch(pad_id: int, device: str | torch.device = "cpu") -> Batch:
    """A micro-batch with nothing to train (one pad token pair, no loss token): a rank with fewer
    micro-batches than another runs these, so that every rank's forwards and backwards pair up."""
    zeros = torch.zeros((1, 2), dtype=torch.float32, device=device)
    return Batch(input_ids=torch.full((1, 2), pad_id, dtype=torch.long, device=device),
                 attention_mask=torch.ones((1, 2), dtype=torch.long, device=device), loss_mask=zeros,
                 behaviour_logprobs=zeros.clone(), advantages=torch.zeros(1, device=device),
                 temperatures=torch.ones(1, device=device), rollout_ids=())
