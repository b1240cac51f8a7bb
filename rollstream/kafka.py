"""Typed Kafka plumbing shared by every stage.

* :class:`EventProducer` encodes events with their topic's codec and keys them by the
  registry's key field; ``acks=all``; ``send`` returns once the broker acknowledged.
  ``send_many`` of many events builds the record batches itself (aiokafka's batch API, with
  Kafka's default murmur2 partitioner, so each key lands where ``send`` would put it):
  a few microseconds per record instead of a future and a coroutine hop each.
* :class:`EventConsumer` decodes records into :class:`Delivery` objects. A record that
  does not decode, or decodes into an invalid event, is written to ``<topic>.dlq`` with
  its original bytes, position and reason, counted, and never returned.
* Offsets: auto-commit is off. A stage calls ``done(delivery)`` once the delivery's
  outputs are acknowledged; ``commit()`` commits, per partition, the lowest offset that is
  not done yet. Work may finish out of order without ever committing past unfinished work.
  On a rebalance the revoked partitions' safe offsets are committed and their tracking is
  dropped; their in-flight records will be redelivered elsewhere (at-least-once: sinks
  dedupe by id).

Works against Apache Kafka and the local Tansu broker: it never relies on ``end_offsets``,
idempotent producers or transactions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError
from aiokafka.partitioner import DefaultPartitioner

from rollstream.config import InfraConfig
from rollstream.errors import KafkaError, converted
from rollstream.infra import resolve_endpoints
from rollstream.metrics import StageMetrics
from rollstream.retry import retry
from rollstream.schemas import DeadLetter, SchemaError, codec, dlq_spec, topic
from rollstream.schemas.events import Event

log = logging.getLogger(__name__)
E = TypeVar("E", bound=Event)
DLQ_REASON_LIMIT = 4000
# send_many below this many records sends them one by one: they then share lingering
# batches with concurrent sends (an executor's few records per execution), where batches
# of their own would each cost a request.
BATCH_API_MIN_RECORDS = 32


def topic_name(infra: InfraConfig, name: str) -> str:
    """The full topic name: ``infra.topic_prefix`` + registry name."""
    return f"{infra.topic_prefix}{name}"


def bootstrap_of(infra: InfraConfig) -> str:
    return resolve_endpoints(infra).kafka_bootstrap


async def ensure_topics(infra: InfraConfig, names: Iterable[str], *, with_dlq: bool = True) -> None:
    """Create the registry topics ``names`` (and their ``.dlq``) if they do not exist."""
    wanted: dict[str, int] = {}
    for name in names:
        spec = topic(name)
        wanted[topic_name(infra, spec.name)] = infra.partitions or spec.partitions
        if with_dlq and not name.endswith(".dlq"):
            wanted[topic_name(infra, dlq_spec(name).name)] = 1
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_of(infra), client_id="rollstream-admin")
    with converted("connecting the admin client", into=KafkaError):
        await retry(admin.start, what="connect admin client", retry_on=(KafkaConnectionError, OSError))
    try:
        with converted(f"creating topics {sorted(wanted)}", into=KafkaError):
            existing = set(await admin.list_topics())
            new = [
                NewTopic(name, num_partitions=parts, replication_factor=infra.replication_factor)
                for name, parts in wanted.items()
                if name not in existing
            ]
            if new:
                try:
                    await admin.create_topics(new)
                except TopicAlreadyExistsError:
                    pass  # a concurrent creator won the race
                log.info("created topics %s", ", ".join(t.name for t in new))
    finally:
        await admin.close()


async def create_topic(infra: InfraConfig, full_name: str, partitions: int) -> bool:
    """Create topic ``full_name`` (any name, not only the registry's) unless it exists; True if created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_of(infra), client_id="rollstream-admin")
    with converted("connecting the admin client", into=KafkaError):
        await retry(admin.start, what="connect admin client", retry_on=(KafkaConnectionError, OSError))
    try:
        with converted(f"creating topic {full_name}", into=KafkaError):
            if full_name in set(await admin.list_topics()):
                return False
            try:
                await admin.create_topics([NewTopic(full_name, num_partitions=partitions,
                                                    replication_factor=infra.replication_factor)])
            except TopicAlreadyExistsError:
                return False
            return True
    finally:
        await admin.close()


async def read_to_end(infra: InfraConfig, full_name: str, *, timeout_s: float = 120.0) -> list[Any]:
    """Every record of topic ``full_name`` from the start to its end at the time of reading (each
    partition's high watermark as fetches report it), with no consumer group. Raises KafkaError
    when the topic does not exist or the end is not reached within ``timeout_s``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_of(infra), group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_poll_records=5000,
                                max_partition_fetch_bytes=8 << 20, fetch_max_wait_ms=100)
    with converted(f"connecting to read {full_name}", into=KafkaError):
        await retry(consumer.start, what="connect consumer", retry_on=(KafkaConnectionError, OSError))
    records: list[Any] = []
    try:
        partitions = consumer.partitions_for_topic(full_name)
        if not partitions:
            await consumer.topics()  # refresh the metadata once
            partitions = consumer.partitions_for_topic(full_name)
        if not partitions:
            raise KafkaError(f"topic {full_name} does not exist on {bootstrap_of(infra)}")
        tps = [TopicPartition(full_name, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while True:
            with converted(f"reading {full_name}", into=KafkaError):
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records += batch
                ends = {tp: consumer.highwater(tp) for tp in tps}
                if all(end is not None for end in ends.values()):
                    positions = [await consumer.position(tp) for tp in tps]
                    if all(pos >= ends[tp] for pos, tp in zip(positions, tps)):
                        return records
            if time.monotonic() > deadline:
                raise KafkaError(f"reading {full_name}: not at its end after {timeout_s:.0f} s "
                                 f"({len(records)} records read)")
    finally:
        await consumer.stop()


async def delete_topics(infra: InfraConfig, full_names: Iterable[str]) -> None:
    """Delete topics by full name (tests and benchmarks clean up with it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_of(infra), client_id="rollstream-admin")
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [name for name in full_names if name in existing]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


@dataclass(frozen=True, slots=True)
class Delivery(Generic[E]):
    """One decoded record and where it came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    event: E
    received_at: float
    value: bytes | None = None  # the record's bytes, for a dead letter of a record that decoded
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class EventProducer:
    """Typed producer: ``async with EventProducer(infra, client_id=...) as producer``."""

    def __init__(
        self,
        infra: InfraConfig,
        *,
        client_id: str,
        metrics: StageMetrics | None = None,
        stage: str = "",
    ) -> None:
        self.infra = infra
        self.client_id = client_id
        self.metrics = metrics
        self.stage = stage or client_id
        self._producer: AIOKafkaProducer | None = None
        self._partitioner = DefaultPartitioner()

    async def __aenter__(self) -> EventProducer:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_of(self.infra),
            client_id=self.client_id,
            acks="all",
            linger_ms=self.infra.linger_ms,
            max_batch_size=self.infra.max_batch_bytes,
            max_request_size=max(self.infra.max_batch_bytes, 8 << 20),
            request_timeout_ms=30000,
        )
        with converted("connecting the producer", into=KafkaError):
            await retry(self._producer.start, what="connect producer",
                        retry_on=(KafkaConnectionError, OSError))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            await self._producer.stop()  # flushes what is queued
            self._producer = None

    @property
    def raw(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise KafkaError("producer used outside `async with`")
        return self._producer

    async def enqueue(self, name: str, event: Event) -> asyncio.Future[Any]:
        """Queue ``event`` on registry topic ``name``; the returned future resolves on ack."""
        full_name, key, value = self._record(name, event)
        with converted(f"producing to {name}", into=KafkaError):
            return await self.raw.send(full_name, value, key=key)

    def _record(self, name: str, event: Event) -> tuple[str, bytes | None, bytes]:
        """(full topic name, key, encoded value) of ``event`` on registry topic ``name``."""
        spec = topic(name)
        return topic_name(self.infra, spec.name), spec.key(event), codec(spec.event).encode(event)

    async def send(self, name: str, event: Event) -> None:
        """Produce ``event`` to registry topic ``name`` and wait for the broker's ack."""
        await self._settle([await self.enqueue(name, event)], [name])

    async def send_many(self, items: Sequence[tuple[str, Event]]) -> None:
        """Produce all ``(topic, event)`` pairs (batched) and wait until every one is acknowledged.

        Order is kept per partition, as with ``send``.
        """
        if len(items) < BATCH_API_MIN_RECORDS:
            futures = [await self.enqueue(name, event) for name, event in items]
        else:
            futures = await self._send_batches(items)
        await self._settle(futures, [name for name, _ in items])

    async def _send_batches(self, items: Sequence[tuple[str, Event]]) -> list[asyncio.Future[Any]]:
        """Encode ``items`` into record batches, one open batch per partition; return the
        batches' delivery futures. A full batch is submitted at once, the rest at the end,
        closed, so that they do not wait out the linger time."""
        raw = self.raw
        futures: list[asyncio.Future[Any]] = []
        open_batches: dict[tuple[str, int], Any] = {}  # (topic, partition) -> aiokafka BatchBuilder
        partitions: dict[str, list[int]] = {}
        with converted(lambda: f"producing to {sorted(partitions)}", into=KafkaError):
            for name, event in items:
                full_name, key, value = self._record(name, event)
                if full_name not in partitions:
                    partitions[full_name] = sorted(await raw.partitions_for(full_name))
                all_partitions = partitions[full_name]
                where = (full_name, self._partitioner(key, all_partitions, all_partitions))
                batch = open_batches.get(where)
                if batch is None:
                    batch = open_batches[where] = raw.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: it closed itself
                    futures.append(await raw.send_batch(batch, where[0], partition=where[1]))
                    batch = open_batches[where] = raw.create_batch()
                    batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
            for (full_name, partition), batch in open_batches.items():
                batch.close()
                futures.append(await raw.send_batch(batch, full_name, partition=partition))
        return futures

    async def _settle(self, futures: list[asyncio.Future[Any]], names: list[str]) -> None:
        with converted(lambda: f"acknowledgement of records for {sorted(set(names))}", into=KafkaError):
            await asyncio.gather(*futures)
        if self.metrics is not None:
            for name in names:
                self.metrics.records_out(self.stage, name).inc()

    async def dead_letter(self, source: Delivery[Any] | RawRecord, reason: str, *, stage: str | None = None,
                          value: bytes | None = None) -> None:
        """Write ``source`` to ``<topic>.dlq`` with ``reason``; waits for the ack.

        The record's original bytes go with it: ``source.value`` unless ``value`` is given.
        """
        registry_name = source.topic.removeprefix(self.infra.topic_prefix)
        original = value if value is not None else source.value
        letter = DeadLetter(
            topic=source.topic,
            partition=source.partition,
            offset=source.offset,
            key=source.key,
            value=original,
            reason=reason[:DLQ_REASON_LIMIT],
            stage=stage or self.stage,
            failed_at=time.time(),
        )
        spec = dlq_spec(registry_name)
        future = await self.raw.send(
            topic_name(self.infra, spec.name), codec(DeadLetter).encode(letter), key=source.key
        )
        await self._settle([future], [spec.name])
        if self.metrics is not None:
            self.metrics.dead_lettered(self.stage, registry_name, reason_kind(reason)).inc()
        log.warning("dead-lettered %s[%d]@%d: %s", source.topic, source.partition, source.offset, reason)


def reason_kind(reason: str) -> str:
    """A short, bounded label for a DLQ reason (metrics must not use free text)."""
    for kind in ("undecodable", "schema_version", "invalid", "tombstone"):
        if kind in reason:
            return kind
    return "rejected"


@dataclass
class _PartitionTracker:
    """Offsets received but not yet done, in order; the safe commit point is the first of them."""

    pending: deque[int] = field(default_factory=deque)
    done: set[int] = field(default_factory=set)
    next_offset: int | None = None  # one past the last offset received

    def received(self, offset: int) -> None:
        self.pending.append(offset)
        self.next_offset = offset + 1

    def mark_done(self, offset: int) -> None:
        self.done.add(offset)
        while self.pending and self.pending[0] in self.done:
            self.done.discard(self.pending.popleft())

    def safe_offset(self) -> int | None:
        return self.pending[0] if self.pending else self.next_offset


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, owner: EventConsumer[Any]) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.owner._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.owner._on_assigned(assigned)


class EventConsumer(Generic[E]):
    """Typed consumer of one registry topic with dead-lettering and safe manual commits.

    ``start_offsets`` (partition -> offset) seeks those partitions on assignment,
    overriding committed offsets (the learner resumes from its checkpoint this way).
    """

    def __init__(
        self,
        infra: InfraConfig,
        name: str,
        *,
        group_id: str,
        producer: EventProducer,
        stage: str,
        metrics: StageMetrics | None = None,
        start_offsets: Mapping[int, int] | None = None,
        max_poll_records: int = 500,
        client_id: str | None = None,
    ) -> None:
        self.infra = infra
        self.spec = topic(name)
        self.topic = topic_name(infra, self.spec.name)
        self.group_id = group_id
        self.producer = producer
        self.stage = stage
        self.metrics = metrics
        self.start_offsets = dict(start_offsets or {})
        self.max_poll_records = max_poll_records
        self.client_id = client_id or f"{stage}-consumer"
        self._codec = codec(self.spec.event)
        self._trackers: dict[int, _PartitionTracker] = {}
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> EventConsumer[E]:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_of(self.infra),
            group_id=self.group_id,
            client_id=self.client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_poll_records,
            fetch_max_wait_ms=self.infra.fetch_max_wait_ms,
            session_timeout_ms=int(self.infra.session_timeout_s * 1000),
            heartbeat_interval_ms=1000,
        )
        self._consumer.subscribe([self.topic], listener=_Rebalance(self))
        with converted("connecting the consumer", into=KafkaError):
            await retry(self._consumer.start, what="connect consumer",
                        retry_on=(KafkaConnectionError, OSError))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            try:
                await self.commit()
            except KafkaError as error:  # leaving anyway: uncommitted records are redelivered
                log.warning("final commit failed: %s", error)
            await self._consumer.stop()
            self._consumer = None

    @property
    def raw(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise KafkaError("consumer used outside `async with`")
        return self._consumer

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.raw.assignment()}

    async def getmany(self, max_records: int | None = None, timeout_s: float = 1.0) -> list[Delivery[E]]:
        """The next decoded records (possibly none within ``timeout_s``); bad ones are dead-lettered."""
        batches = await self.raw.getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        now = time.time()
        out: list[Delivery[E]] = []
        for tp, records in batches.items():
            tracker = self._trackers.setdefault(tp.partition, _PartitionTracker())
            for record in records:
                tracker.received(record.offset)
                try:
                    event = self._codec.decode(record.value)
                except SchemaError as exc:
                    raw = RawRecord(record.topic, record.partition, record.offset, record.key, record.value)
                    await self.producer.dead_letter(raw, str(exc), stage=self.stage)
                    tracker.mark_done(record.offset)
                    continue
                out.append(Delivery(record.topic, record.partition, record.offset, record.key, event, now,
                                    record.value, tuple(record.headers or ())))
        if self.metrics is not None and out:
            self.metrics.records_in(self.stage, self.spec.name).inc(len(out))
        if self.metrics is not None:
            await self._observe_lag()
        return out

    async def _observe_lag(self) -> None:
        """Per owned partition fetched at least once: its high watermark (from the fetch: the local
        broker's ListOffsets cannot be trusted) minus the offset below which all is done."""
        assert self.metrics is not None
        for tp in self.raw.assignment():
            highwater = self.raw.highwater(tp)
            if highwater is None:
                continue
            tracker = self._trackers.get(tp.partition)
            done_below = tracker.safe_offset() if tracker is not None else None
            if done_below is None:  # nothing received since it was assigned: where reading resumes
                done_below = await self.raw.position(tp)
            self.metrics.observe_lag(self.group_id, self.spec.name, tp.partition, highwater - done_below)

    def done(self, delivery: Delivery[E]) -> None:
        """``delivery``'s outputs are acknowledged: its offset may be committed."""
        tracker = self._trackers.get(delivery.partition)
        if tracker is not None:  # None: the partition was revoked meanwhile
            tracker.mark_done(delivery.offset)
        if self.metrics is not None:
            self.metrics.latency.observe(time.time() - delivery.received_at)

    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the offset below which everything is done (what ``commit`` writes)."""
        return {p: off for p, t in self._trackers.items() if (off := t.safe_offset()) is not None}

    async def commit(self, partitions: Iterable[int] | None = None) -> None:
        offsets = self.safe_offsets()
        if partitions is not None:
            wanted = set(partitions)
            offsets = {p: o for p, o in offsets.items() if p in wanted}
        if not offsets:
            return
        with converted(lambda: f"commit of {self.topic} {offsets}", into=KafkaError):
            await self.raw.commit({TopicPartition(self.topic, p): o for p, o in offsets.items()})

    def pending(self) -> int:
        """Records received and not yet done."""
        return sum(len(t.pending) for t in self._trackers.values())

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        parts = [tp.partition for tp in revoked if tp.topic == self.topic]
        try:
            await self.commit(parts)
        except KafkaError as exc:
            log.warning("commit on revoke failed (records will be redelivered): %s", exc)
        for p in parts:
            self._trackers.pop(p, None)
            if self.metrics is not None:
                self.metrics.forget_lag(self.group_id, self.spec.name, p)

    def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            self._trackers.pop(tp.partition, None)
            if tp.partition in self.start_offsets:  # once: later rebalances resume from commits
                self.raw.seek(tp, self.start_offsets.pop(tp.partition))
        log.info("%s assigned %s", self.stage, sorted(tp.partition for tp in assigned))
