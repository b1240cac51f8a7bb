"""The ``advantages`` topic as the advantage stream writes it (plain aiokafka, no Faust).

Three things the stage needs to emit a group once: the partition a group goes to (fixed
before the group is staged, so that a retry looks in the right place), producing staged
bytes there and waiting for every acknowledgement, and, after a crash, reading the topic
back above a watermark to see whether an earlier attempt got its record acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from rollstream.kafka import EventProducer

log = logging.getLogger("rollstream.stream")
READ_BACK_TIMEOUT_S = 15.0


class AdvantagesTopic:
    """Where groups go, producing them, and finding what an earlier attempt produced."""

    def __init__(self, producer: EventProducer, bootstrap: str, name: str, partitions: Sequence[int]) -> None:
        self.producer = producer
        self.bootstrap = bootstrap
        self.name = name
        self.partitions = sorted(partitions)
        self._partitioner = DefaultPartitioner()

    @classmethod
    async def open(cls, producer: EventProducer, bootstrap: str, name: str) -> AdvantagesTopic:
        """The topic ``name`` as it is now (its partitions are read once)."""
        return cls(producer, bootstrap, name, await producer.raw.partitions_for(name))

    def partition_of(self, group_id: str) -> int:
        """The partition the registry key (group_id) maps to with Kafka's default partitioner."""
        return self._partitioner(group_id.encode(), self.partitions, self.partitions)

    async def produce(self, records: Mapping[str, tuple[int, bytes | None]]) -> dict[str, int]:
        """Produce ``records`` (group_id -> (partition, value)), keyed by group_id; wait for
        every acknowledgement; return each group's offset."""
        raw = self.producer.raw
        sent = [(gid, await raw.send(self.name, value, key=gid.encode(), partition=partition))
                for gid, (partition, value) in records.items()]
        if not sent:
            return {}
        metadata = await asyncio.gather(*(future for _, future in sent))
        return {gid: meta.offset for (gid, _), meta in zip(sent, metadata, strict=True)}

    async def published(self, wanted: Mapping[str, tuple[int, int]]) -> dict[str, int]:
        """Which of ``wanted`` (group_id -> (partition, watermark)) are on the topic above
        their watermark, with their offsets. In doubt (the end of a partition not reached in
        ``READ_BACK_TIMEOUT_S``) a group counts as not published: a repeat is better than a loss.

        The end is the consumer's ``highwater()`` after a fetch: the local broker's
        ``end_offsets`` is wrong."""
        found: dict[str, int] = {}
        start: dict[int, int] = {}
        for partition, watermark in wanted.values():
            start[partition] = min(start.get(partition, watermark + 1), watermark + 1)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                    enable_auto_commit=False, client_id="rollstream-stream-check")
        await consumer.start()
        try:
            tps = {p: TopicPartition(self.name, p) for p in start}
            consumer.assign(list(tps.values()))
            for p, offset in start.items():
                consumer.seek(tps[p], offset)
            pending = set(tps.values())
            deadline = time.monotonic() + READ_BACK_TIMEOUT_S
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
                log.warning("could not read %s to its end; re-producing what was not found", self.name)
        finally:
            await consumer.stop()
        log.info("staged-group check: %d of %d were already on %s", len(found), len(wanted), self.name)
        return found
