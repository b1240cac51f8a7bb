"""The open-group store: every unfinished GRPO group lives in Redis, not in the worker.

Why Redis and not a Faust table: the local broker restores Faust changelogs wrongly after a
restart, and faust-streaming 0.15.3's ack-based commit can move past un-acked offsets. So
nothing here depends on the worker's memory, on changelogs or on when Faust commits: a
reward is written to Redis before its offset is acknowledged, and everything needed to
finish a group (its rollouts, its chosen output, its deadline) is in Redis from then on.

Keys (under ``infra.key_prefix + "stream:"``):

* ``g:{group_id}``   hash rollout_id -> RewardScored bytes (HSETNX: a duplicate rollout_id
  is ignored and counted).
* ``dl:{partition}`` sorted set group_id -> deadline (unix s) of open groups, per input
  partition, so the worker owning a partition sweeps only its own groups.
* ``ready:{partition}`` set of groups with >= group_size rollouts, not yet finished.
* ``out:{group_id}`` the staged outcome (msgpack :class:`Outcome`): written once (SET NX)
  before anything is produced, so any retry after a crash produces the same bytes.
* ``wm:{group_id}`` the watermark staged with it: the highest acknowledged offset of the
  group's output partition known at that moment (from ``outpos``).
* ``outpos:{partition}`` highest acknowledged offset this stage produced to ``advantages``.
* ``done:{group_id}`` marker (emitted / filtered / dropped), with a TTL (``done_ttl_s``):
  rewards arriving for a done group are counted as late and ignored.

Life of a group: ``add`` (atomic per batch) -> [``load``] -> ``stage`` (SET NX, first
attempt or not) -> produce + await acks -> ``finish`` (done marker, cleanup, output
position; ``mark_group_dropped`` for filtered/dropped ones). Every step is one Lua script
call (the scripts are in streams/lua/). A crash before ``stage`` recomputes; a crash after
it finds the staged outcome, and the stage (streams/advantages.py) first reads
``advantages`` above the watermark: if the record is there (the worker died between the
broker's ack and ``finish``) it only finishes, else it produces the staged bytes. A crash
after ``finish`` changes nothing.

This module needs a single Redis (the Lua scripts build their keys; not Redis Cluster).
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal

import msgspec
import redis.asyncio as aioredis

from rollstream.config import InfraConfig, StreamConfig
from rollstream.redis import mark_group_dropped
from rollstream.schemas import (
    AdvantagedRollout,
    Codec,
    ExcludedRollout,
    GroupAdvantaged,
    GroupStats,
    RewardScored,
    codec,
)
from rollstream.streams import estimators
from rollstream.streams.estimators import GroupInput

OutcomeKind = Literal["emitted", "dropped"]  # an emitted outcome with a reason is a filtered group


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What was decided for a group; staged in Redis before any side effect."""

    kind: OutcomeKind
    reason: str = ""  # filtered / dropped: a fixed label (estimators.ZERO_VARIANCE, ...)
    complete: bool = True
    value: bytes | None = None  # emitted: the encoded GroupAdvantaged
    excluded: int = 0  # rollouts left out (outcome infra: no reward)


_outcome_encoder = msgspec.msgpack.Encoder()
_outcome_decoder = msgspec.msgpack.Decoder(Outcome)

# Arguments and replies travel as one "framed" string each (a 4-byte big-endian length before
# every field): packing and parsing tens of thousands of separate Redis arguments and reply
# items in redis-py costs more CPU than the whole rest of the stage. The Lua side (its
# ``frame``/``unframe``, the reply format, the scripts) is in streams/lua/.
_LEN = struct.Struct(">I")


@functools.cache
def lua_source(*names: str) -> str:
    """``streams/lua/{name}.lua`` for each name, joined in order (helpers before the script
    that calls them); package data, read with importlib.resources."""
    folder = resources.files("rollstream.streams").joinpath("lua")
    return "\n".join(folder.joinpath(f"{name}.lua").read_text() for name in names)


def frame(fields: Iterable[bytes | str | int | float]) -> bytes:
    """Length-prefixed concatenation (the inverse of the scripts' ``unframe``)."""
    parts: list[bytes] = []
    append, pack = parts.append, _LEN.pack
    for value in fields:
        data = value if type(value) is bytes else str(value).encode()
        append(pack(len(data)))
        append(data)
    return b"".join(parts)


def unframe(blob: bytes) -> list[bytes]:
    out, i, n = [], 0, len(blob)
    unpack = _LEN.unpack_from
    while i < n:
        (size,) = unpack(blob, i)
        out.append(blob[i + 4 : i + 4 + size])
        i += 4 + size
    return out


@dataclass(frozen=True, slots=True)
class Arrival:
    """One validated reward, ready to be stored."""

    group_id: str
    rollout_id: str
    group_size: int
    partition: int
    deadline: float  # unix seconds: first arrival + group_deadline_s (the first one wins)
    value: bytes  # the RewardScored bytes as consumed


@dataclass(slots=True)
class LoadedGroup:
    group_id: str
    partition: int
    staged: Outcome | None = None  # a previous attempt's decision (re-produce it as is)
    watermark: int = -1  # staged: highest acked output offset known when it was staged
    rollouts: dict[str, bytes] = field(default_factory=dict)  # rollout_id -> RewardScored bytes


@dataclass(frozen=True, slots=True)
class AddResult:
    ready: list[LoadedGroup]  # groups that now have all their rollouts (with them)
    duplicates: int  # rollout ids already stored
    late: int  # rewards of groups already finished


@dataclass(frozen=True, slots=True)
class Staged:
    outcome: Outcome
    first: bool  # staged by this call: nothing can have been produced for it yet
    watermark: int  # see streams/lua/stage.lua


@dataclass(frozen=True, slots=True)
class Finished:
    group_id: str
    partition: int  # input partition
    kind: OutcomeKind
    out_partition: int = -1  # emitted: where it was produced, and at which offset
    offset: int = -1


@dataclass(frozen=True, slots=True)
class Due:
    group_id: str
    partition: int
    expired: bool  # the deadline has passed (else it is only ready)


def _parse_groups(reply: Sequence[bytes], start: int, arrived: Mapping[str, bytes] | None = None
                  ) -> list[LoadedGroup]:
    """Open groups out of a reply (see streams/lua/group_reply.lua); done and empty ones are skipped.
    ``arrived`` ("group_id/rollout_id" -> bytes) fills in the values the reply left out."""
    groups, i = [], start
    while i < len(reply):
        gid, part, state, count = reply[i].decode(), int(reply[i + 1]), reply[i + 2], int(reply[i + 3])
        body = reply[i + 4 : i + 4 + count]
        i += 4 + count
        group = LoadedGroup(gid, part)
        if state == b"S":
            group.staged = _outcome_decoder.decode(body[0])
            group.watermark = int(body[1])
        elif state == b"R":
            for j in range(0, count, 2):
                rid = body[j].decode()
                group.rollouts[rid] = body[j + 1] or (arrived or {})[f"{gid}/{rid}"]
        else:
            continue
        groups.append(group)
    return groups


class GroupStore:
    """Redis-backed open groups; one instance per worker (it holds only a client and names).

    Each method is one Lua script call (one round trip, atomic), whatever the batch size.
    """

    def __init__(self, client: aioredis.Redis, infra: InfraConfig, *, done_ttl_s: int) -> None:
        self.client = client
        self.infra = infra
        self.prefix = f"{infra.key_prefix}stream:"
        self.done_ttl_s = done_ttl_s
        self._add = client.register_script(lua_source("framing", "group_reply", "add"))
        self._load = client.register_script(lua_source("framing", "group_reply", "load"))
        self._stage = client.register_script(lua_source("framing", "stage"))
        self._finish = client.register_script(lua_source("framing", "finish"))

    def key(self, kind: str, name: str | int) -> str:
        return f"{self.prefix}{kind}:{name}"

    async def add(self, arrivals: Sequence[Arrival]) -> AddResult:
        """Store a batch atomically; return the groups it completed, with their rollouts."""
        if not arrivals:
            return AddResult([], 0, 0)
        fields: list[bytes | str | int | float] = []
        for a in arrivals:
            fields += [a.group_id, a.rollout_id, a.group_size, a.partition, repr(a.deadline), a.value]
        reply = unframe(await self._add(keys=[], args=[self.prefix, frame(fields)]))
        arrived = {f"{a.group_id}/{a.rollout_id}": a.value for a in arrivals}
        return AddResult(_parse_groups(reply, 2, arrived), int(reply[0]), int(reply[1]))

    async def due(self, partitions: Iterable[int], now: float, limit: int = 1000) -> list[Due]:
        """Groups of ``partitions`` that are ready (also after a crash) or past their deadline."""
        parts = sorted(set(partitions))
        if not parts:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for p in parts:
                pipe.zrangebyscore(self.key("dl", p), "-inf", now, start=0, num=limit)
                pipe.srandmember(self.key("ready", p), limit)
            replies = await pipe.execute()
        found: dict[str, Due] = {}
        for i, p in enumerate(parts):
            expired, ready = replies[2 * i], replies[2 * i + 1]
            for gid in ready or []:
                found[gid.decode()] = Due(gid.decode(), p, False)
            for gid in expired or []:
                found[gid.decode()] = Due(gid.decode(), p, True)
        return list(found.values())

    async def load(self, groups: Sequence[tuple[str, int]]) -> list[LoadedGroup]:
        """The open groups' rollouts or staged outcomes; groups already done are cleared away."""
        if not groups:
            return []
        fields = [x for gid, part in groups for x in (gid, part)]
        return _parse_groups(unframe(await self._load(keys=[], args=[self.prefix, frame(fields)])), 0)

    async def stage(self, outcomes: Mapping[str, Outcome], out_partitions: Mapping[str, int]
                    ) -> dict[str, Staged]:
        """Write each outcome unless one is staged already; return what is staged now.

        ``out_partitions``: the output partition of each group to be emitted.
        """
        if not outcomes:
            return {}
        fields = [x for gid, o in outcomes.items()
                  for x in (gid, _outcome_encoder.encode(o), out_partitions.get(gid, -1))]
        reply = unframe(await self._stage(keys=[], args=[self.prefix, self.done_ttl_s, frame(fields)]))
        staged: dict[str, Staged] = {}
        for i, (gid, outcome) in enumerate(outcomes.items()):
            first, watermark, earlier = reply[3 * i] == b"1", int(reply[3 * i + 1]), reply[3 * i + 2]
            staged[gid] = Staged(outcome if first else _outcome_decoder.decode(earlier), first, watermark)
        return staged

    async def finish(self, finished: Sequence[Finished]) -> None:
        """Mark groups done and clear their state (atomically). Filtered/dropped ones are first
        reported with ``mark_group_dropped``: a set add, so a crash in between and the retry
        (from the same staged outcome) count each group once."""
        if not finished:
            return
        dropped = [f.group_id for f in finished if f.kind != "emitted"]
        if dropped:
            async with self.client.pipeline(transaction=False) as pipe:
                for gid in dropped:
                    await mark_group_dropped(pipe, self.infra, gid)  # queues SADD on the pipeline
                await pipe.execute()
        fields = [x for f in finished for x in (f.group_id, f.partition, f.kind, f.out_partition, f.offset)]
        await self._finish(keys=[], args=[self.prefix, self.done_ttl_s, frame(fields)])


def decide(
    groups: Sequence[LoadedGroup],
    expired: Mapping[str, bool],
    stream: StreamConfig,
    default_group_size: int,
    now: float | None = None,
    fresh: Mapping[str, tuple[bytes, RewardScored]] | None = None,
) -> dict[str, Outcome]:
    """Outcomes of the loaded groups that have one (pure; ``now`` stamps ``emitted_at``).

    A group is decided when all ``group_size`` rollouts arrived, or when its deadline passed:
    then it is emitted as incomplete if it has >= ``min_group_size`` rollouts, else dropped
    (reason ``incomplete``). Rollouts whose outcome is ``infra`` (no reward: the machinery failed
    under them) count as arrived but are left out of the advantages and listed in ``excluded``;
    when fewer than ``min_group_size`` others remain the group is emitted filtered (``infra``). Zero-variance groups are filtered when configured: emitted with
    ``filtered`` set and advantages 0, for the learner to record and count. Advantages of the
    others are computed over all groups emitted together (that matters for task/batch scope).
    Groups already staged keep their staged outcome; open groups that are neither complete
    nor expired get none. ``fresh`` (rollout_id -> (bytes, event)) saves decoding rewards
    that were just decoded on arrival.
    """
    now = time.time() if now is None else now
    reward_codec = codec(RewardScored)
    outcomes: dict[str, Outcome] = {}
    to_emit: list[tuple[str, list[RewardScored], list[float], bool]] = []
    for group in groups:
        if group.staged is not None:
            outcomes[group.group_id] = group.staged
            continue
        arrived = sorted(
            (_decoded(rid, value, fresh, reward_codec) for rid, value in group.rollouts.items()),
            key=lambda e: (e.rollout.sample_index, e.rollout.rollout_id),
        )
        size = arrived[0].rollout.group_size if arrived else default_group_size
        complete = len(arrived) >= size
        if not complete and not expired.get(group.group_id, False):
            continue
        if not complete and len(arrived) < stream.min_group_size:
            outcomes[group.group_id] = Outcome(kind="dropped", reason=estimators.INCOMPLETE, complete=False)
            continue
        # an infra outcome is no reward: the group is resolved over the others
        rewards = [e for e in arrived if e.outcome != "infra"]
        excluded = [ExcludedRollout(rollout_id=e.rollout.rollout_id, sample_index=e.rollout.sample_index,
                                    reason=e.execution.error_message[:4096]) for e in arrived if e.outcome == "infra"]
        if excluded and len(rewards) < stream.min_group_size:
            event = build_event(group.group_id, rewards, [0.0] * len(rewards), stream.estimator, complete, now,
                                filtered=estimators.INFRA, excluded=excluded, first=arrived[0])
            outcomes[group.group_id] = Outcome(kind="emitted", reason=estimators.INFRA, complete=complete,
                                               value=codec(GroupAdvantaged).encode(event), excluded=len(excluded))
            continue
        clipped = estimators.clip_rewards([e.reward for e in rewards], stream.reward_clip)
        reason = estimators.filter_reason(clipped, stream.filter_zero_variance)
        if reason is not None:  # emitted for the record (its fate is the learner's), nothing to train
            event = build_event(group.group_id, rewards, [0.0] * len(rewards), stream.estimator, complete, now,
                                filtered=reason, excluded=excluded)
            outcomes[group.group_id] = Outcome(kind="emitted", reason=reason, complete=complete,
                                               value=codec(GroupAdvantaged).encode(event), excluded=len(excluded))
            continue
        to_emit.append((group.group_id, rewards, clipped, complete, excluded))

    advantages = estimators.batch_advantages(
        [GroupInput(rewards[0].rollout.task_id, clipped, rewards[0].rollout.family)
         for _, rewards, clipped, _, _ in to_emit],
        stream.estimator,
        stream.normalize,
        std_eps=stream.std_eps,
    )
    encode = codec(GroupAdvantaged).encode
    for (gid, rewards, _, complete, excluded), group_adv in zip(to_emit, advantages, strict=True):
        event = build_event(gid, rewards, group_adv, stream.estimator, complete, now, excluded=excluded)
        outcomes[gid] = Outcome(kind="emitted", complete=complete, value=encode(event), excluded=len(excluded))
    return outcomes


def _decoded(rollout_id: str, value: bytes, fresh: Mapping[str, tuple[bytes, RewardScored]] | None,
             reward_codec: Codec[RewardScored]) -> RewardScored:
    known = fresh.get(rollout_id) if fresh else None
    if known is not None and known[0] == value:
        return known[1]
    return reward_codec.decode(value)


def build_event(
    group_id: str,
    rewards: Sequence[RewardScored],
    advantages: Sequence[float],
    estimator: str,
    complete: bool,
    now: float,
    filtered: str = "",
    excluded: Sequence[ExcludedRollout] = (),
    first: RewardScored | None = None,
) -> GroupAdvantaged:
    """``first``: a rollout of the group to name it by when ``rewards`` is empty (every one excluded)."""
    head = (first or rewards[0]).rollout
    stats = estimators.reward_stats([e.reward for e in rewards]) if rewards else estimators.RewardStats(0.0, 0.0, 0.0, 0.0)
    return GroupAdvantaged(
        group_id=group_id,
        task_id=head.task_id,
        family=head.family,
        estimator=estimator,
        complete=complete,
        rollouts=[
            AdvantagedRollout(rollout=e.rollout, reward=e.reward, advantage=a, passed=e.execution.passed)
            for e, a in zip(rewards, advantages, strict=True)
        ],
        stats=GroupStats(
            size=len(rewards),
            expected_size=head.group_size,
            reward_mean=stats.mean,
            reward_std=stats.std,
            reward_min=stats.min,
            reward_max=stats.max,
        ),
        emitted_at=now,
        filtered=filtered,
        excluded=list(excluded),
    )
