"""The advantage stream: completes GRPO groups exactly once and computes their advantages.

Consumes ``rewards`` (RewardScored, keyed by group_id); produces one GroupAdvantaged per
group to ``advantages`` (keyed by group_id). Undecodable or invalid records go to
``rewards.dlq`` as DeadLetter records.

Guarantees:

* Each batch of rewards is stored in Redis (:mod:`rollstream.streams.groups`) before Faust may ack,
  let alone commit, its offsets; open groups never live in worker memory or Faust tables.
  A SIGKILL at any moment loses nothing: replayed rewards are ignored by rollout_id, and
  groups left complete-but-unfinished are found again by the owner's sweep.
* A group is decided once: its outcome is staged in Redis (SET NX) before it is produced,
  so a retry re-produces byte-identical output; its done marker is set after the broker
  acknowledged it. A retry of a staged group first reads ``advantages`` above the
  watermark staged with it, so a worker killed between the ack and the marker does not
  cause a repeat. The one case left: two live workers on one partition during a rebalance
  (an old owner still finishing a batch) may both produce a group's identical bytes; the
  learner keeps the first GroupAdvantaged per group_id (docs/stream.md).
* A group's rewards share a partition (key = group_id) and each partition has one owner, so
  several workers in the Faust group split the partitions without splitting a group.
* Incomplete groups: at ``group_deadline_s`` after the first reward, emit if at least
  ``min_group_size`` arrived, else drop (counted, ``mark_group_dropped``).
* Groups with nothing to train on (zero variance, when ``filter_zero_variance``) are emitted
  like the others, flagged ``filtered`` with advantages 0: the learner records their fate and
  counts them, and no step trains on them.
* SIGTERM/SIGINT: finish the batch in hand, commit Faust's acked offsets, exit 0. (Faust's
  own shutdown hangs with buffered un-acked events; nothing un-stored is ever acked.)

Layout: :class:`AdvantageStage` is the stage's logic, read top to bottom: ``handle`` (add
rewards) -> ``resolve`` (decide, stage, emit once, finish) and ``sweep`` (deadlines, groups
left ready by a crash). It knows Redis only through :class:`rollstream.streams.groups.GroupStore`, the
output topic through :class:`rollstream.streams.output.AdvantagesTopic`, and nothing of Faust:
:mod:`rollstream.streams.faust_runtime` feeds it batches and sweeps, acks and commits, and holds
every Faust workaround (exits, signals, speed settings).

Entry point: ``async def run(config)``, which ``rollstream stream [--config rollstream.toml]``
calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager

from rollstream.config import Config
from rollstream.errors import ConfigError
from rollstream.infra import Endpoints, resolve_endpoints
from rollstream.kafka import EventProducer, RawRecord, topic_name
from rollstream.metrics import StageMetrics
from rollstream.schemas import RewardScored, SchemaError, codec, topic
from rollstream.schemas.stages import consumer_group
from rollstream.stage_io import open_stage
from rollstream.streams.estimators import get_estimator
from rollstream.streams.faust_runtime import serve
from rollstream.streams.groups import Arrival, Finished, GroupStore, LoadedGroup, Outcome, decide
from rollstream.streams.output import AdvantagesTopic

log = logging.getLogger("rollstream.stream")
STAGE = "stream"


def validate(event: RewardScored) -> None:
    """Checks the schema cannot express; a failure dead-letters the record."""
    rollout = event.rollout
    if rollout.sample_index >= rollout.group_size:
        raise SchemaError(f"invalid RewardScored: sample_index {rollout.sample_index} >= group_size {rollout.group_size}")


class AdvantageStage:
    """Rewards in, groups out, exactly once. Calls to ``handle`` and ``sweep`` must not overlap
    (the runtime takes turns)."""

    def __init__(self, config: Config, *, store: GroupStore, producer: EventProducer,
                 output: AdvantagesTopic, metrics: StageMetrics) -> None:
        self.config = config
        self.store = store
        self.producer = producer  # dead letters
        self.output = output
        self.metrics = metrics
        m = metrics
        self.groups_emitted = m.counter("stream_groups_emitted", "Groups produced to advantages", ("complete",))
        self.groups_filtered = m.counter("stream_groups_filtered", "Groups filtered (no signal)", ("reason",))
        self.groups_dropped = m.counter("stream_groups_dropped", "Groups dropped at the deadline", ("reason",))
        self.rollouts_excluded = m.counter(
            "stream_rollouts_excluded", "Rollouts left out of their group's advantages, by outcome (infra: the "
            "machinery failed under them, no reward)", ("outcome",))
        self.rewards_duplicate = m.counter("stream_rewards_duplicate", "Rewards whose rollout_id was stored already")
        self.rewards_late = m.counter("stream_rewards_late", "Rewards of groups already finished")
        self.groups_recovered = m.counter("stream_groups_recovered",
                                          "Staged groups found already produced after a crash")
        self.owned = m.gauge("stream_owned_partition", "1 for each rewards partition this worker owns",
                             ("partition",))
        self._decode = codec(RewardScored).decode

    async def handle(self, records: Sequence[RawRecord]) -> None:
        """Store a batch of rewards; finish the groups it completes. When it returns, the
        batch may be acked: it is in Redis, and the groups it completed are finished."""
        started = time.monotonic()
        deadline = time.time() + self.config.stream.group_deadline_s
        arrivals: list[Arrival] = []
        fresh: dict[str, tuple[bytes, RewardScored]] = {}  # rollout_id -> (bytes, event): decoded once
        for record in records:
            try:
                event = self._decode(record.value)
                validate(event)
            except SchemaError as exc:
                await self.producer.dead_letter(record, str(exc), stage=STAGE)
                continue
            r = event.rollout
            value = record.value or b""
            arrivals.append(Arrival(r.group_id, r.rollout_id, r.group_size, record.partition, deadline, value))
            fresh[r.rollout_id] = (value, event)
        self.metrics.records_in(STAGE, "rewards").inc(len(records))
        result = await self.store.add(arrivals)
        self.rewards_duplicate.inc(result.duplicates)
        self.rewards_late.inc(result.late)
        if result.ready:
            await self.resolve(result.ready, {}, fresh)
        self.metrics.latency.observe(time.monotonic() - started)

    async def sweep(self, partitions: Sequence[int]) -> None:
        """Finish this worker's groups that are past their deadline or were left ready."""
        for partition in range(self.config.infra.partitions or topic("rewards").partitions):
            self.owned.labels(str(partition)).set(1 if partition in partitions else 0)
        if not partitions:
            return
        due = await self.store.due(partitions, time.time())
        if due:
            loaded = await self.store.load([(d.group_id, d.partition) for d in due])
            await self.resolve(loaded, {d.group_id: d.expired for d in due})

    async def resolve(self, loaded: list[LoadedGroup], expired: dict[str, bool],
                      fresh: dict[str, tuple[bytes, RewardScored]] | None = None) -> None:
        """Decide, stage, produce (awaiting acks), then mark done: in that order."""
        decided = decide(loaded, expired, self.config.stream, self.config.rl.group_size, fresh=fresh)
        if not decided:
            return
        out_partitions = {gid: self.output.partition_of(gid) for gid, o in decided.items() if o.kind == "emitted"}
        staged = await self.store.stage(decided, out_partitions)
        # An outcome staged by an earlier attempt may have been produced just before that
        # attempt died: look for it on `advantages` above the watermark before producing again.
        retried = {gid: (out_partitions[gid], s.watermark) for gid, s in staged.items()
                   if s.outcome.kind == "emitted" and not s.first}
        published = await self.output.published(retried) if retried else {}
        self.groups_recovered.inc(len(published))
        offsets = await self.output.produce({gid: (out_partitions[gid], s.outcome.value) for gid, s in staged.items()
                                             if s.outcome.kind == "emitted" and gid not in published})
        self.metrics.records_out(STAGE, "advantages").inc(len(offsets))
        offsets.update(published)
        partition_of = {g.group_id: g.partition for g in loaded}
        await self.store.finish([
            Finished(gid, partition_of[gid], s.outcome.kind, out_partitions.get(gid, -1), offsets.get(gid, -1))
            for gid, s in staged.items()
        ])
        self._count(s.outcome for s in staged.values())

    def _count(self, outcomes: Iterable[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.excluded:
                self.rollouts_excluded.labels("infra").inc(outcome.excluded)
                log.info("a group resolved without %d rollout(s) the machinery lost", outcome.excluded)
            if outcome.kind == "emitted" and outcome.reason:  # emitted flagged: nothing to train on
                self.groups_filtered.labels(outcome.reason).inc()
                log.debug("filtered a group: %s", outcome.reason)
            elif outcome.kind == "emitted":
                self.groups_emitted.labels("true" if outcome.complete else "false").inc()
            else:
                self.groups_dropped.labels(outcome.reason).inc()


@asynccontextmanager
async def open_stream(config: Config, endpoints: Endpoints) -> AsyncIterator[AdvantageStage]:
    """The stage on its plumbing (rollstream/stage_io.py: metrics served, topics, Redis, producer;
    the consumer is Faust's), closed on the way out (a worker that exits through ``os._exit`` or
    SIGKILL never gets there; nothing depends on it)."""
    async with open_stage(config, STAGE, client_id="rollstream-stream") as io:
        assert io.producer is not None
        output = await AdvantagesTopic.open(io.producer, endpoints.kafka_bootstrap,
                                            topic_name(config.infra, "advantages"))
        store = GroupStore(io.redis, config.infra, done_ttl_s=config.stream.done_ttl_s)
        yield AdvantageStage(config, store=store, producer=io.producer, output=output, metrics=io.metrics)


def check_estimator(config: Config) -> None:
    """Refuse to start with an advantage estimator nobody registered (streams/estimators.py)."""
    try:
        get_estimator(config.stream.estimator)
    except ValueError as exc:
        raise ConfigError(f"stream.estimator: {exc}") from None


async def run(config: Config) -> None:
    """Run one stream worker until SIGTERM/SIGINT (``rollstream stream``).

    The Faust worker runs inside the caller's event loop and never returns normally: it
    stops with ``os._exit`` (:mod:`rollstream.streams.faust_runtime`), as Faust's own shutdown can hang.
    """
    check_estimator(config)
    endpoints = resolve_endpoints(config)
    async with open_stream(config, endpoints) as stage:
        log.info("stream %s -> %s; config: %s %s", topic_name(config.infra, "rewards"), stage.output.name,
                 config.stream, config.rl)
        group = consumer_group(config.infra.topic_prefix, STAGE)  # the Faust app id is its consumer group
        await serve(stage, config, endpoints,
                    on_lag=lambda partition, lag: stage.metrics.observe_lag(group, "rewards", partition, lag))
