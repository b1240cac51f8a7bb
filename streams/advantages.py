"""The advantage stream: completes GRPO groups exactly once and computes their advantages.

Consumes ``rewards`` (RewardScored, keyed by group_id) with a Faust agent; produces one
GroupAdvantaged per group to ``advantages`` (keyed by group_id). Undecodable or invalid
records go to ``rewards.dlq`` as DeadLetter records.

Guarantees:

* Each batch of rewards is stored in Redis (:mod:`streams.groups`) before Faust may ack,
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
* SIGTERM/SIGINT: finish the batch in hand, commit Faust's acked offsets, exit 0. (Faust's
  own shutdown hangs with buffered un-acked events; nothing un-stored is ever acked.)

Entry points: ``async def run(config)`` (``rollstream stream``), :func:`main` (blocking), or
``python -m streams.advantages [--config rollstream.toml] [--set section.key=value ...]``.

Most of a worker's CPU is Faust's per-event machinery: :func:`faust_app` holds the settings
that cut it (docs/stream.md, "Settings that matter for speed"); bench/stream.py measures
Faust's floor with the same function.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError as AIOKafkaError
from aiokafka.partitioner import DefaultPartitioner

from rollstream.config import Config, load_config
from rollstream.infra import Endpoints, resolve_endpoints
from rollstream.kafka import EventProducer, RawRecord, ensure_topics, topic_name
from rollstream.lifecycle import setup_logging, tune_gc
from rollstream.metrics import StageMetrics, serve_metrics
from rollstream.redis import connect
from schemas import RewardScored, SchemaError, codec, topic
from streams.groups import Arrival, Finished, GroupStore, LoadedGroup, Outcome, decide

log = logging.getLogger("rollstream.stream")
STAGE = "stream"
EXIT_ON_ERROR = 70  # a batch failed half way: die before Faust can ack it (see _die)


@dataclass(frozen=True, slots=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def validate(event: RewardScored) -> None:
    """Checks the schema cannot express; a failure dead-letters the record."""
    rollout = event.rollout
    if rollout.sample_index >= rollout.group_size:
        raise SchemaError(f"invalid RewardScored: sample_index {rollout.sample_index} >= group_size {rollout.group_size}")


class StreamStage:
    """The stage's state: Redis store, producer, metrics, one lock (batch vs sweep)."""

    def __init__(self, config: Config, endpoints: Endpoints) -> None:
        self.config = config
        self.endpoints = endpoints
        self.rewards_topic = topic_name(config.infra, "rewards")
        self.advantages_topic = topic_name(config.infra, "advantages")
        self.metrics = StageMetrics(STAGE)
        m = self.metrics
        self.groups_emitted = m.counter("stream_groups_emitted", "Groups produced to advantages", ("complete",))
        self.groups_filtered = m.counter("stream_groups_filtered", "Groups filtered (no signal)", ("reason",))
        self.groups_dropped = m.counter("stream_groups_dropped", "Groups dropped at the deadline", ("reason",))
        self.rewards_duplicate = m.counter("stream_rewards_duplicate", "Rewards whose rollout_id was stored already")
        self.rewards_late = m.counter("stream_rewards_late", "Rewards of groups already finished")
        self.groups_recovered = m.counter("stream_groups_recovered",
                                          "Staged groups found already produced after a crash")
        self.owned = m.gauge("stream_owned_partition", "1 for each rewards partition this worker owns",
                             ("partition",))
        self.lock = asyncio.Lock()
        self.stopping = False
        self.redis: aioredis.Redis | None = None
        self.producer: EventProducer | None = None
        self.store: GroupStore | None = None
        self._partitioner = DefaultPartitioner()
        self._out_partitions: list[int] = []

    async def start(self) -> None:
        if self.store is not None:
            return
        self.redis = connect(self.endpoints.redis_url)
        self.producer = EventProducer(self.config.infra, client_id="rollstream-stream", metrics=self.metrics,
                                      stage=STAGE)
        await self.producer.__aenter__()
        self.store = GroupStore(self.redis, self.config.infra, done_ttl_s=self.config.stream.done_ttl_s)
        self._out_partitions = sorted(await self.producer.raw.partitions_for(self.advantages_topic))
        serve_metrics(self.config.stream.metrics_port, self.metrics)
        log.info("stream %s -> %s; config: %s %s", self.rewards_topic, self.advantages_topic,
                 self.config.stream, self.config.rl)

    async def close(self) -> None:
        """Close the producer and Redis client (a worker killed by SIGKILL never gets here)."""
        if self.producer is not None:
            await self.producer.__aexit__(None, None, None)
        if self.redis is not None:
            await self.redis.aclose()
        self.producer = self.redis = self.store = None

    async def handle(self, records: Sequence[Record]) -> None:
        """Store a batch of rewards; finish the groups it completes."""
        await self.start()
        assert self.store is not None and self.producer is not None
        started = time.monotonic()
        now = time.time()
        deadline = now + self.config.stream.group_deadline_s
        decode = codec(RewardScored).decode
        arrivals: list[Arrival] = []
        fresh: dict[str, tuple[bytes, RewardScored]] = {}
        for record in records:
            try:
                event = decode(record.value)
                validate(event)
            except SchemaError as exc:
                raw = RawRecord(self.rewards_topic, record.partition, record.offset, record.key, record.value)
                await self.producer.dead_letter(raw, str(exc), stage=STAGE)
                continue
            r = event.rollout
            value = record.value or b""
            arrivals.append(Arrival(r.group_id, r.rollout_id, r.group_size, record.partition, deadline, value))
            fresh[r.rollout_id] = (value, event)
        self.metrics.records_in(STAGE, "rewards").inc(len(records))
        async with self.lock:
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
        await self.start()
        assert self.store is not None
        if not partitions:
            return
        async with self.lock:
            due = await self.store.due(partitions, time.time())
            if due:
                loaded = await self.store.load([(d.group_id, d.partition) for d in due])
                await self.resolve(loaded, {d.group_id: d.expired for d in due})

    async def resolve(self, loaded: list[LoadedGroup], expired: dict[str, bool],
                      fresh: dict[str, tuple[bytes, RewardScored]] | None = None) -> None:
        """Decide, stage, produce (awaiting acks), then mark done: in that order."""
        assert self.store is not None
        decided = decide(loaded, expired, self.config.stream, self.config.rl.group_size, fresh=fresh)
        if not decided:
            return
        out_partitions = {gid: self._out_partition(gid) for gid, o in decided.items() if o.kind == "emitted"}
        staged = await self.store.stage(decided, out_partitions)
        # An outcome staged by an earlier attempt may have been produced just before that
        # attempt died: look for it on `advantages` above the watermark before producing again.
        retried = {gid: (out_partitions[gid], s.watermark) for gid, s in staged.items()
                   if s.outcome.kind == "emitted" and not s.first}
        published = await self.published(retried) if retried else {}
        self.groups_recovered.inc(len(published))
        offsets = await self._produce({gid: s.outcome for gid, s in staged.items() if gid not in published},
                                      out_partitions)
        offsets.update(published)
        partition_of = {g.group_id: g.partition for g in loaded}
        await self.store.finish([
            Finished(gid, partition_of[gid], s.outcome.kind, out_partitions.get(gid, -1), offsets.get(gid, -1))
            for gid, s in staged.items()
        ])
        self._count(s.outcome for s in staged.values())

    def _out_partition(self, group_id: str) -> int:
        """The partition the registry key (group_id) maps to with Kafka's default partitioner."""
        return self._partitioner(group_id.encode(), self._out_partitions, self._out_partitions)

    async def _produce(self, outcomes: dict[str, Outcome], out_partitions: dict[str, int]) -> dict[str, int]:
        """Produce the emitted outcomes and wait for every ack; return their offsets."""
        assert self.producer is not None
        raw = self.producer.raw
        sent = [
            (gid, await raw.send(self.advantages_topic, outcome.value, key=gid.encode(),
                                 partition=out_partitions[gid]))
            for gid, outcome in outcomes.items()
            if outcome.kind == "emitted"
        ]
        if not sent:
            return {}
        metadata = await asyncio.gather(*(future for _, future in sent))
        self.metrics.records_out(STAGE, "advantages").inc(len(sent))
        return {gid: meta.offset for (gid, _), meta in zip(sent, metadata, strict=True)}

    async def published(self, wanted: dict[str, tuple[int, int]]) -> dict[str, int]:
        """Which of ``wanted`` (group_id -> (partition, watermark)) are on ``advantages`` above
        their watermark, with their offsets. In doubt (the end of a partition not reached in
        15 s) a group counts as not published: a repeat is better than a loss."""
        found: dict[str, int] = {}
        start: dict[int, int] = {}
        for partition, watermark in wanted.values():
            start[partition] = min(start.get(partition, watermark + 1), watermark + 1)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.endpoints.kafka_bootstrap, group_id=None,
                                    enable_auto_commit=False, client_id="rollstream-stream-check")
        await consumer.start()
        try:
            tps = {p: TopicPartition(self.advantages_topic, p) for p in start}
            consumer.assign(list(tps.values()))
            for p, offset in start.items():
                consumer.seek(tps[p], offset)
            pending = set(tps.values())
            deadline = time.monotonic() + 15
            while pending and time.monotonic() < deadline:
                batch = await consumer.getmany(*pending, timeout_ms=300)
                for messages in batch.values():
                    for m in messages:
                        gid = (m.key or b"").decode(errors="replace")
                        if gid in wanted and wanted[gid][0] == m.partition and m.offset > wanted[gid][1]:
                            found[gid] = m.offset
                for tp in list(pending):
                    highwater = consumer.highwater(tp)
                    if highwater is not None and await consumer.position(tp) >= highwater:
                        pending.discard(tp)
            if pending:
                log.warning("could not read %s to its end; re-producing what was not found", self.advantages_topic)
        finally:
            await consumer.stop()
        log.info("staged-group check: %d of %d were already on %s", len(found), len(wanted), self.advantages_topic)
        return found

    def _count(self, outcomes: Any) -> None:
        for outcome in outcomes:
            if outcome.kind == "emitted":
                self.groups_emitted.labels("true" if outcome.complete else "false").inc()
            elif outcome.kind == "filtered":
                self.groups_filtered.labels(outcome.reason).inc()
                log.debug("filtered a group: %s", outcome.reason)
            else:
                self.groups_dropped.labels(outcome.reason).inc()


def _die(code: int) -> None:
    """Exit now, without Faust's shutdown: it would ack the batch in hand (take_events acks
    in a ``finally``) and then commit past rewards that never reached Redis."""
    logging.shutdown()
    os._exit(code)


# Faust's default per-partition fetch (1 MiB, ~850 rewards of 64 completion tokens) left the
# worker's event loop waiting for the consumer thread between fetches; 4 MiB kept it busy
# (bare read rate ~5k -> ~7.5k/s in bench/stream.py; more than 4 MiB gained nothing).
FETCH_BYTES_PER_PARTITION = 4 << 20


class RawSchema(faust.Schema):
    """Keys and values exactly as consumed (``bytes``, or None).

    The stage decodes values itself (msgspec), and must see undecodable bytes to dead-letter
    them, so Faust's serializer registry could only pass the bytes through: going round it
    saves its per-event lookups (about a tenth of a bare Faust reader's CPU).
    """

    def loads_key(self, app: faust.types.AppT, message: faust.types.Message, *,
                  loads: Any = None, serializer: Any = None) -> Any:
        return message.key

    def loads_value(self, app: faust.types.AppT, message: faust.types.Message, *,
                    loads: Any = None, serializer: Any = None) -> Any:
        return message.value


class LeanMonitor(faust.Monitor):
    """Faust's default sensor less its per-event bookkeeping (counters, timestamps and dict
    updates for every message and stream event, a few µs each). Nothing reads those
    statistics here: the Faust web server is off and the stage keeps its own Prometheus
    metrics. Rebalance, commit and send hooks are Faust's own."""

    def on_message_in(self, tp: faust.types.TP, offset: int, message: faust.types.Message) -> None:
        pass

    def on_stream_event_in(self, tp: faust.types.TP, offset: int, stream: Any, event: Any) -> None:
        return None

    def on_stream_event_out(self, tp: faust.types.TP, offset: int, stream: Any, event: Any,
                            state: dict[str, Any] | None = None) -> None:
        pass

    def on_message_out(self, tp: faust.types.TP, offset: int, message: faust.types.Message) -> None:
        pass

    def track_tp_end_offset(self, tp: faust.types.TP, offset: int) -> None:
        pass


def faust_app(app_id: str, config: Config, endpoints: Endpoints, datadir: str) -> faust.App:
    """A Faust app with the stage's settings. bench/stream.py builds its bare reader with it
    too, so that the floor it measures is Faust's under the same settings."""
    infra, stream = config.infra, config.stream
    return faust.App(
        app_id,
        broker=[f"kafka://{host}" for host in endpoints.kafka_bootstrap.split(",")],
        store="memory://",
        datadir=datadir,
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_linger_ms=infra.linger_ms,
        producer_max_batch_size=infra.max_batch_bytes,
        topic_replication_factor=infra.replication_factor,
        topic_partitions=infra.partitions or topic("rewards").partitions,
        stream_buffer_maxsize=max(4096, 2 * stream.batch_max),
        consumer_max_fetch_size=FETCH_BYTES_PER_PARTITION,
        # The repaired Cython stream iterator takes events already queued without awaiting
        # the channel (faust's setting docs). Acks are unaffected: take_events acks itself,
        # and the stage's correctness does not rest on them anyway.
        cython_optimizations=True,
        monitor=LeanMonitor(),
        broker_commit_interval=1.0,
        # Short timeouts: a SIGKILLed member is noticed in seconds, and the local broker
        # holds a join for the whole rebalance timeout.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=10.0,
        loghandlers=[],
    )


def rewards_topic(app: faust.App, name: str) -> faust.types.TopicT:
    """The rewards topic of ``app``, delivering raw bytes (:class:`RawSchema`)."""
    return app.topic(name, schema=RawSchema(key_type=bytes, value_type=bytes,
                                            key_serializer="raw", value_serializer="raw"))


def build_app(config: Config, endpoints: Endpoints) -> tuple[faust.App, StreamStage]:
    """The Faust app of the stage (no module-level app) and the stage object it drives."""
    infra, stream = config.infra, config.stream
    stage = StreamStage(config, endpoints)
    state_dir = Path(infra.state_dir) / "faust"
    state_dir.mkdir(parents=True, exist_ok=True)
    app = faust_app(f"{infra.topic_prefix}stream", config, endpoints, str(state_dir))
    rewards = rewards_topic(app, stage.rewards_topic)

    async def rewards_agent(events_stream: Any) -> None:
        async for events in events_stream.take_events(stream.batch_max, within=stream.batch_within_s):
            try:
                await stage.handle([
                    Record(e.message.partition, e.message.offset, e.message.key, e.message.value) for e in events
                ])
            except asyncio.CancelledError:
                log.warning("stream agent cancelled mid-batch; exiting before the batch can be acked")
                _die(0)
            except BaseException:
                log.exception("a batch of %d rewards failed; exiting so that it is redelivered", len(events))
                _die(EXIT_ON_ERROR)
            if stage.stopping:
                await _stop(app, stage)

    app.agent(rewards, name=f"{infra.topic_prefix}advantages", concurrency=1)(rewards_agent)

    async def sweeper() -> None:
        assigned = [tp.partition for tp in app.consumer.assignment() if tp.topic == stage.rewards_topic]
        try:
            await stage.sweep(assigned)
        except Exception:
            log.exception("sweeping due groups failed; exiting so that a fresh worker takes over")
            _die(EXIT_ON_ERROR)

    app.timer(stream.sweep_interval_s, name=f"{infra.topic_prefix}stream-sweep")(sweeper)
    return app, stage


async def _stop(app: faust.App, stage: StreamStage) -> None:
    """Graceful stop between batches: commit what Faust acked (all of it stored), exit 0."""
    async with stage.lock:
        try:
            await asyncio.wait_for(app.consumer.commit(), timeout=5.0)
        except (TimeoutError, AIOKafkaError, OSError) as exc:  # offsets only save replay: Redis holds the truth
            log.warning("commit on stop failed (%s); rewards since the last commit will be replayed", exc)
        log.info("stream worker stopped")
        _die(0)


class _Worker(faust.Worker):
    """Faust worker whose SIGTERM/SIGINT stop between batches instead of Faust's shutdown."""

    stage: StreamStage

    def _on_sigterm(self) -> None:
        self._request_stop()

    def _on_sigint(self) -> None:
        self._request_stop()

    def _request_stop(self) -> None:
        if self.stage.stopping:
            _die(1)  # second signal: go now
        self.stage.stopping = True
        log.info("stop requested")
        asyncio.ensure_future(_stop(self.app, self.stage))


async def run(config: Config) -> None:
    """Run one stream worker until SIGTERM/SIGINT (``rollstream stream``).

    Faust runs inside the caller's event loop; the worker never returns normally: it stops
    with ``os._exit`` (see :func:`_stop`), as Faust's own shutdown can hang.
    """
    endpoints = resolve_endpoints(config)
    await ensure_topics(config.infra, ["rewards", "advantages"])
    app, stage = build_app(config, endpoints)
    # Logging is the caller's (rollstream.lifecycle.setup_logging): Faust's own set-up at
    # level warn would install a spinner that turns the root logger to DEBUG.
    worker = _Worker(app, loglevel="info", quiet=True, redirect_stdouts=False, override_logging=False,
                     loop=asyncio.get_running_loop())
    worker.stage = stage
    await worker.start()


def main(config: Config) -> None:
    """Blocking form of :func:`run`."""
    asyncio.run(run(config))


def cli(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streams.advantages", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None, help="TOML config file")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    config = load_config(args.config, args.set)
    tune_gc()  # as `rollstream stream` does
    main(config)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    cli()
