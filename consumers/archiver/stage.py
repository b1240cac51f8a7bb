"""The archiver stage: every topic of a run (dead-letter topics included) -> the run archive.

Consumer group ``<topic prefix>archiver``; run as many as there are partitions to share.
Records are buffered per partition and written as one Parquet file per partition
(``rollstream/archive.py``) when ``archive.flush_records`` are buffered in all partitions
together, ``archive.flush_s`` after a partition's first buffered record arrived, when the
partition is revoked, and on SIGTERM. Writing runs in a thread while polling goes on. A file is durable (fsynced and renamed, or one
object PUT) before its offsets are committed.

Exactly once: on assignment a partition is positioned after the last offset the archive holds
(at its beginning when it holds none), not at the committed offset (commits serve lag monitoring), so a SIGKILL between writing a file and committing it neither
loses nor repeats a record; readers also skip offsets an earlier file holds (a stalled owner).
Nothing is dropped: a record that does not decode is archived with its bytes and empty fields
(counted in ``rollstream_archive_undecoded_total``).

SIGTERM: read on until every assigned partition is archived up to its end (the high watermark
of the last fetch) or ``archive.drain_timeout_s`` passed, write what is buffered, commit, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaConnectionError

from rollstream.archive import EMPTY_ROW, TOPICS_FILE, ArchiveStore, archive_url, hour_of, row_fields, schema
from rollstream.config import Config
from rollstream.errors import KafkaError, converted
from rollstream.kafka import bootstrap_of, ensure_topics, topic_name
from rollstream.metrics import StageMetrics
from rollstream.retry import retry
from rollstream.schemas import TOPICS
from rollstream.schemas.stages import consumer_group
from rollstream.schemas.topics import DLQ_SUFFIX

log = logging.getLogger(__name__)
STAGE = "archiver"


def archived_topics() -> list[str]:
    """Registry names of every topic a run writes: the topics and their dead-letter topics."""
    return [n for name in TOPICS for n in (name, name + DLQ_SUFFIX)]


@dataclass
class Buffer:
    """Records of one partition received and not yet written (aiokafka ConsumerRecords, in offset order)."""

    records: list[Any] = field(default_factory=list)
    since: float = 0.0  # monotonic time of the first record

    def extend(self, records: list[Any]) -> None:
        if not self.records:
            self.since = time.monotonic()
        self.records.extend(records)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def last_offset(self) -> int:
        return self.records[-1].offset


def build_tables(name: str, records: list[Any]) -> tuple[list[tuple[str, Any]], int]:
    """The records as one table per UTC hour of their timestamps, and how many did not decode."""
    import pyarrow as pa

    values = [r.value for r in records]
    timestamps = [r.timestamp for r in records]
    rows = [row_fields(name, value) for value in values]
    undecoded = rows.count(None)
    columns = list(zip(*(row or EMPTY_ROW for row in rows)))
    table = pa.table({
        "offset": pa.array([r.offset for r in records], pa.int64()),
        "timestamp": pa.array(timestamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "key": pa.array([r.key for r in records], pa.binary()),
        "group_id": pa.array(columns[0], pa.string()),
        "rollout_id": pa.array(columns[1], pa.string()),
        "task_id": pa.array(columns[2], pa.string()),
        "family": pa.array(columns[3], pa.string()),
        "policy_version_first": pa.array(columns[4], pa.int64()),
        "policy_version_last": pa.array(columns[5], pa.int64()),
        "reward": pa.array(columns[6], pa.float64()),
        "verdict": pa.array(columns[7], pa.string()),
        "value": pa.array(values, pa.large_binary()),
    }, schema=schema())
    first_hour = hour_of(min(timestamps))
    if first_hour == hour_of(max(timestamps)):
        return [(first_hour, table)], undecoded
    # Split at hour changes (timestamps are not strictly ordered: keep offset order within a file).
    hours = [hour_of(ts) for ts in timestamps]
    pieces, start = [], 0
    for i in range(1, len(hours) + 1):
        if i == len(hours) or hours[i] != hours[start]:
            pieces.append((hours[start], table.slice(start, i - start)))
            start = i
    return pieces, undecoded


class _Listener(ConsumerRebalanceListener):
    def __init__(self, archiver: Archiver) -> None:
        self.archiver = archiver

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.archiver.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.archiver.on_assigned(assigned)


class Archiver:
    """Buffers, writes and commits; one per process."""

    def __init__(self, config: Config, store: ArchiveStore, metrics: StageMetrics) -> None:
        self.config = config
        self.c = config.archive
        self.store = store
        self.metrics = metrics
        self.prefix = config.infra.topic_prefix
        self.names = {topic_name(config.infra, name): name for name in archived_topics()}
        self.buffers: dict[TopicPartition, Buffer] = {}
        self.consumer: AIOKafkaConsumer | None = None
        self.lock = asyncio.Lock()  # flushes never interleave (a revoke during a timed flush)
        self.archived = metrics.counter("archive_records", "Records written to the archive", ("topic",))
        self.undecoded = metrics.counter("archive_undecoded", "Records archived whose value did not decode",
                                         ("topic",))
        self.files = metrics.counter("archive_files", "Archive files written", ("topic",))
        self.flush_seconds = metrics.histogram("archive_flush_seconds", "Time to write and commit one file")
        self.records_total = 0  # written to the archive by this process
        self.first_record_at: float | None = None  # perf_counter() when the first record arrived

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        """Position each partition after what the archive holds (the files are the truth)."""
        by_topic: dict[str, list[TopicPartition]] = {}
        for tp in assigned:
            by_topic.setdefault(tp.topic, []).append(tp)
        for full, tps in by_topic.items():
            nexts = await asyncio.to_thread(self.store.next_offsets, self.names[full])
            fresh = []
            for tp in tps:
                self.buffers.pop(tp, None)
                if tp.partition in nexts:
                    self.raw.seek(tp, nexts[tp.partition])
                else:
                    fresh.append(tp)
            if fresh:  # nothing archived yet: from the start, whatever the group committed before
                await self.raw.seek_to_beginning(*fresh)
        log.info("archiver assigned %d partitions", len(assigned))

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        try:
            await self.flush([tp for tp in revoked if tp in self.buffers])
        except (OSError, KafkaError) as exc:  # the next owner continues after the last file written
            log.warning("flush on revoke failed (the next owner re-reads those records): %s", exc)
        for tp in revoked:
            self.buffers.pop(tp, None)
            self.metrics.forget_lag(f"{self.prefix}{STAGE}", self.names[tp.topic], tp.partition)

    @property
    def raw(self) -> AIOKafkaConsumer:
        assert self.consumer is not None
        return self.consumer

    def take(self, batches: dict[TopicPartition, list[Any]]) -> None:
        if batches and self.first_record_at is None:
            self.first_record_at = time.perf_counter()
        for tp, records in batches.items():
            self.buffers.setdefault(tp, Buffer()).extend(records)

    def due(self, now: float) -> list[TopicPartition]:
        """Partitions to write now: all of them once ``flush_records`` are buffered in all (memory
        stays bounded), else those whose first record waited ``flush_s``."""
        if sum(len(b) for b in self.buffers.values()) >= self.c.flush_records:
            return [tp for tp, b in self.buffers.items() if len(b)]
        return [tp for tp, b in self.buffers.items() if len(b) and now - b.since >= self.c.flush_s]

    async def flush(self, tps: list[TopicPartition]) -> None:
        """Write the buffers of ``tps`` (one file per partition and hour), then commit them."""
        async with self.lock:
            work = [(tp, self.buffers[tp]) for tp in tps if tp in self.buffers and len(self.buffers[tp])]
            if not work:
                return
            started = time.perf_counter()
            for tp, _ in work:
                self.buffers[tp] = Buffer()
            await asyncio.to_thread(self._write, work)
            offsets = {tp: buffer.last_offset + 1 for tp, buffer in work}
            with converted(lambda: f"commit of {len(offsets)} archived partitions", into=KafkaError):
                await self.raw.commit(offsets)
            self.flush_seconds.observe(time.perf_counter() - started)

    def _write(self, work: list[tuple[TopicPartition, Buffer]]) -> None:
        for tp, buffer in work:
            name = self.names[tp.topic]
            pieces, undecoded = build_tables(name, buffer.records)
            for hour, table in pieces:
                self.store.write_file(name, tp.partition, hour, table, self.c.compression)
                self.files.labels(name).inc()
            self.archived.labels(name).inc(len(buffer))
            self.records_total += len(buffer)
            if undecoded:
                self.undecoded.labels(name).inc(undecoded)

    async def write_topics_file(self) -> None:
        """``_topics.json``: the prefix and each topic's partition count (readers locate groups by it)."""
        counts = {}
        for full, name in self.names.items():
            parts = self.raw.partitions_for_topic(full)
            if parts:
                counts[name] = len(parts)
        known = await asyncio.to_thread(self.store.topics)
        merged = {"prefix": self.prefix, "topics": {**known.get("topics", {}), **counts}}
        if merged != known:
            await asyncio.to_thread(self.store.write_json, TOPICS_FILE, merged)

    async def caught_up(self) -> bool:
        """Every assigned partition read up to the high watermark its last fetch reported (the
        local broker's ListOffsets cannot be trusted for this; fetch responses can)."""
        for tp in self.raw.assignment():
            high = self.raw.highwater(tp)
            if high is None or await self.raw.position(tp) < high:
                return False
        return True

    async def observe_lag(self) -> None:
        """Per owned partition fetched at least once: records at the broker not yet in the archive
        (the high watermark of the last fetch minus the position, plus what is buffered)."""
        group = f"{self.prefix}{STAGE}"
        for tp in self.raw.assignment():
            high = self.raw.highwater(tp)
            if high is None:
                continue
            buffered = len(self.buffers[tp]) if tp in self.buffers else 0
            lag = high - await self.raw.position(tp) + buffered
            self.metrics.observe_lag(group, self.names[tp.topic], tp.partition, lag)

    async def run(self, stop: asyncio.Event) -> None:
        c = self.c
        topics_known = False
        flushing: asyncio.Task[None] | None = None  # one flush at a time, while polling goes on
        try:
            while not stop.is_set():
                batches = await self.raw.getmany(timeout_ms=200, max_records=c.max_poll_records)
                if not topics_known and self.raw.assignment():
                    await self.write_topics_file()
                    topics_known = True
                self.take(batches)
                await self.observe_lag()
                if flushing is not None and flushing.done():
                    flushing, done = None, flushing
                    done.result()  # a failed write or commit stops the stage (nothing is committed past it)
                if flushing is None:
                    due = self.due(time.monotonic())
                    if due:
                        flushing = asyncio.create_task(self.flush(due))
        finally:
            if flushing is not None:
                await flushing
        await self.drain()

    async def drain(self) -> None:
        """Read on until caught up (or the drain timeout), write everything, commit."""
        deadline = time.monotonic() + self.c.drain_timeout_s
        empty_polls = 0
        while time.monotonic() < deadline:
            batches = await self.raw.getmany(timeout_ms=200, max_records=self.c.max_poll_records)
            self.take(batches)
            empty_polls = 0 if batches else empty_polls + 1
            if empty_polls >= 2 and await self.caught_up():
                break
        else:
            log.warning("archiver: drain timeout (%.0f s) before every partition was read to its end",
                        self.c.drain_timeout_s)
        await self.flush(list(self.buffers))
        if self.raw.assignment():
            await self.write_topics_file()


@contextlib.asynccontextmanager
async def open_archiver(config: Config, metrics: StageMetrics | None = None) -> AsyncIterator[Archiver]:
    """An archiver with its consumer started (subscribed to every topic of the run); stopped on exit."""
    metrics = metrics or StageMetrics(STAGE)
    store = ArchiveStore(archive_url(config))
    archiver_id = f"{STAGE}-{socket.gethostname()}-{os.getpid()}"
    log.info("archiver %s: %s -> %s", archiver_id, config.infra.topic_prefix, store.root)
    await ensure_topics(config.infra, list(TOPICS))
    archiver = Archiver(config, store, metrics)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_of(config.infra), group_id=consumer_group(config.infra.topic_prefix, STAGE),
        client_id=archiver_id, enable_auto_commit=False, auto_offset_reset="earliest",
        max_poll_records=config.archive.max_poll_records, fetch_max_wait_ms=config.infra.fetch_max_wait_ms,
        max_partition_fetch_bytes=8 << 20, session_timeout_ms=int(config.infra.session_timeout_s * 1000),
        heartbeat_interval_ms=1000)
    consumer.subscribe(list(archiver.names), listener=_Listener(archiver))
    archiver.consumer = consumer
    with converted("connecting the archiver's consumer", into=KafkaError):
        await retry(consumer.start, what="connect consumer", retry_on=(KafkaConnectionError, OSError))
    try:
        yield archiver
    finally:
        await consumer.stop()
    log.info("archiver %s stopped: %d records archived", archiver_id, archiver.records_total)


async def run(config: Config, *, stop: asyncio.Event | None = None, metrics: StageMetrics | None = None) -> None:
    """Run the archiver until ``stop`` is set (default: SIGTERM/SIGINT), then drain and exit."""
    from rollstream.lifecycle import stop_event
    from rollstream.stage_io import open_stage

    stop = stop or stop_event()
    async with open_stage(config, STAGE, client_id=f"{STAGE}-{os.getpid()}", metrics=metrics) as io, \
            open_archiver(config, io.metrics) as archiver:  # its own consumer, over every topic
        await archiver.run(stop)


async def check_complete(config: Config, store: ArchiveStore, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Compare the archive with the broker: per partition of every topic of the run, the records
    archived and the end of the partition (the high watermark a fetch reports). Writes and returns
    ``_complete.json``: ``complete`` is true when every partition is archived to its end."""
    from rollstream.archive import COMPLETE_FILE

    names = {topic_name(config.infra, name): name for name in archived_topics()}
    counts = await asyncio.to_thread(store.counts)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_of(config.infra), enable_auto_commit=False,
                                group_id=None, fetch_max_wait_ms=100, max_poll_records=1)
    with converted("connecting to check the archive", into=KafkaError):
        await retry(consumer.start, what="connect consumer", retry_on=(KafkaConnectionError, OSError))
    try:
        tps = []
        for full in names:
            for partition in sorted(consumer.partitions_for_topic(full) or ()):
                tps.append(TopicPartition(full, partition))
        consumer.assign(tps)
        for tp in tps:
            archived = counts.get(names[tp.topic], {}).get(tp.partition)
            consumer.seek(tp, archived[1] if archived else 0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.highwater(tp) is None for tp in tps):
            await consumer.getmany(timeout_ms=200)
        ends = {tp: consumer.highwater(tp) for tp in tps}
    finally:
        await consumer.stop()
    report: dict[str, Any] = {"checked_at": time.time(), "topics": {}}
    complete = True
    for tp in tps:
        records, next_offset = counts.get(names[tp.topic], {}).get(tp.partition, (0, 0))
        end = ends[tp]
        ok = end is not None and next_offset >= end
        complete &= ok
        report["topics"].setdefault(names[tp.topic], {})[str(tp.partition)] = {
            "records": records, "next_offset": next_offset, "end_offset": end, "complete": ok}
    report["complete"] = complete and bool(tps)
    report["records"] = sum(p["records"] for t in report["topics"].values() for p in t.values())
    await asyncio.to_thread(store.write_json, COMPLETE_FILE, report)
    return report
