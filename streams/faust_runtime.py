"""Faust, confined: the one module of the advantage stream that knows it runs on Faust.

The stage (:mod:`rollstream.streams.advantages`) is plain code behind :class:`BatchStage`:
``handle(records)`` takes a batch of ``rewards`` records as consumed, ``sweep(partitions)``
finishes the groups due on the partitions this worker owns. :func:`serve` drives it from a
Faust app:

* an agent takes up to ``stream.batch_max`` records (waiting at most
  ``stream.batch_within_s``) and calls ``handle``; Faust acks a batch only after ``handle``
  returned (``take_events`` acks in a ``finally`` after its ``yield``);
* a timer calls ``sweep`` every ``stream.sweep_interval_s`` with the assigned partitions;
* one lock: ``handle``, ``sweep`` and the stop never run at the same time.

Faust workarounds, each for a measured reason (docs/stream.md), all of them here:

* **Exit with** ``os._exit``. If ``handle`` or ``sweep`` raises, the process dies at once:
  unwinding would run ``take_events``' ``finally``, which acks the batch, and Faust's
  commit would then move past rewards that never reached Redis. Exit code
  :data:`EXIT_ON_ERROR`; the batch is redelivered to whoever owns the partition next.
* **Own SIGTERM/SIGINT.** Faust's shutdown hangs with buffered un-acked events, so the
  worker's handlers are replaced: stop taking batches, wait for the one in hand, commit
  what Faust acked (all of it stored), exit 0. A second signal exits at once (code 1).
* **Speed settings** in :func:`faust_app` (bench/stream.py builds its bare reader with the
  same function): a 4 MiB fetch per partition, :class:`RawSchema` (bytes as consumed, round
  Faust's serializer registry), :class:`LeanMonitor` (no per-event statistics), the Cython
  stream iterator, a stream buffer of at least two batches; short session/rebalance
  timeouts so that a killed member is noticed in seconds.
* **Logging stays the caller's** (``override_logging=False``, level info): Faust's own
  set-up at level warn installs a spinner that turns the root logger to DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

import faust
from aiokafka.errors import KafkaError as AIOKafkaError
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport

from rollstream.config import Config, StreamConfig
from rollstream.infra import Endpoints
from rollstream.kafka import RawRecord, topic_name
from rollstream.schemas import topic
from rollstream.schemas.stages import consumer_group

log = logging.getLogger("rollstream.stream")
EXIT_ON_ERROR = 70  # a batch or sweep failed half way: die before Faust can ack it
COMMIT_ON_STOP_TIMEOUT_S = 5.0

# Faust's default per-partition fetch (1 MiB, ~850 rewards of 64 completion tokens) left the
# worker's event loop waiting for the consumer thread between fetches; 4 MiB kept it busy
# (bare read rate ~5k -> ~7.5k/s in bench/stream.py; more than 4 MiB gained nothing).
FETCH_BYTES_PER_PARTITION = 4 << 20
# What a worker logs once its partitions are assigned and events flow (Faust's own line): tests
# and the benchmark wait for it.
READY_LOG_LINE = "Recovery]: Worker ready"


class BatchStage(Protocol):
    """What :func:`serve` drives. Its calls never overlap."""

    async def handle(self, records: Sequence[RawRecord]) -> None:
        """Process a batch of records as consumed; return only when it is safe to ack them."""
        ...

    async def sweep(self, partitions: Sequence[int]) -> None:
        """Periodic work for the input partitions this worker owns now (maybe none)."""
        ...


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


class _ConsumerThread(AIOKafkaConsumerThread):
    """Faust's consumer thread with the fetch wait of ``infra.fetch_max_wait_ms``: Faust fixes it
    at 1500 ms. Kafka answers a fetch as soon as data arrives, but a broker may hold an empty
    fetch for its whole wait (the local one does), and a record produced meanwhile then waits
    for the next fetch: up to 1.5 s on every group's way through the stream."""

    fetch_max_wait_ms = 100

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms  # read when the consumer starts its fetcher
        return consumer


def _transport(app: faust.App, fetch_max_wait_ms: int) -> Any:
    """The Kafka transport of ``app`` with :class:`_ConsumerThread` under its consumer."""

    class Thread(_ConsumerThread):
        pass

    Thread.fetch_max_wait_ms = fetch_max_wait_ms

    class Consumer(AIOKafkaTransport.Consumer):  # type: ignore[misc,valid-type]
        def _new_consumer_thread(self) -> Any:
            return Thread(self, loop=self.loop, beacon=self.beacon)

    class Transport(AIOKafkaTransport):
        pass

    Transport.Consumer = Consumer
    return Transport(app.conf.broker_consumer, app)


def faust_app(app_id: str, config: Config, endpoints: Endpoints, datadir: str) -> faust.App:
    """A Faust app with the stage's settings. bench/stream.py builds its bare reader with it
    too, so that the floor it measures is Faust's under the same settings."""
    infra, stream = config.infra, config.stream
    app = faust.App(
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
        broker_session_timeout=infra.session_timeout_s,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=infra.session_timeout_s,
        loghandlers=[],
    )
    app.transport = _transport(app, infra.fetch_max_wait_ms)  # before anything asks for Faust's own
    return app


def raw_topic(app: faust.App, name: str) -> faust.types.TopicT:
    """Topic ``name`` of ``app``, delivering keys and values as raw bytes (:class:`RawSchema`)."""
    return app.topic(name, schema=RawSchema(key_type=bytes, value_type=bytes,
                                            key_serializer="raw", value_serializer="raw"))


async def serve(stage: BatchStage, config: Config, endpoints: Endpoints, *,
                on_lag: Callable[[int, int], None] | None = None) -> None:
    """Run ``stage`` on ``rewards`` as a member of the Faust group ``<topic_prefix>stream``
    until SIGTERM/SIGINT. It does not return: the process leaves through ``os._exit``.
    ``on_lag(partition, lag)`` hears, after each batch, the records of each partition in it
    beyond the batch (the high watermark of the last fetch minus the batch's next offset)."""
    infra, stream = config.infra, config.stream
    state_dir = Path(infra.state_dir) / "faust"
    state_dir.mkdir(parents=True, exist_ok=True)
    app = faust_app(consumer_group(infra.topic_prefix, "stream"), config, endpoints, str(state_dir))
    driver = _Driver(app, stage, topic_name(infra, "rewards"), stream, on_lag)
    app.agent(raw_topic(app, driver.topic), name=f"{infra.topic_prefix}advantages", concurrency=1)(driver.batches)
    app.timer(stream.sweep_interval_s, name=f"{infra.topic_prefix}stream-sweep")(driver.sweep)
    worker = _Worker(app, loglevel="info", quiet=True, redirect_stdouts=False, override_logging=False,
                     loop=asyncio.get_running_loop())
    worker.driver = driver
    await worker.start()  # returns only if Faust stops by itself


class _Driver:
    """Feeds one stage from one Faust app; batches, sweeps and the stop take turns (one lock)."""

    def __init__(self, app: faust.App, stage: BatchStage, topic: str, stream: StreamConfig,
                 on_lag: Callable[[int, int], None] | None = None) -> None:
        self.app = app
        self.stage = stage
        self.topic = topic
        self.stream = stream
        self.on_lag = on_lag
        self.lock = asyncio.Lock()
        self.stopping = False

    async def batches(self, events_stream: Any) -> None:
        """The agent: each batch goes to ``stage.handle``; Faust acks it when this loop
        asks for the next one, so a failure must exit before that (see :func:`_exit_now`)."""
        topic = self.topic
        async for events in events_stream.take_events(self.stream.batch_max, within=self.stream.batch_within_s):
            if self.stopping:
                await self.stop()
            records = [RawRecord(topic, (m := e.message).partition, m.offset, m.key, m.value) for e in events]
            async with self.lock:
                try:
                    await self.stage.handle(records)
                except asyncio.CancelledError:
                    log.warning("stream agent cancelled mid-batch; exiting before the batch can be acked")
                    _exit_now(0)
                except BaseException:
                    log.exception("a batch of %d rewards failed; exiting so that it is redelivered", len(records))
                    _exit_now(EXIT_ON_ERROR)
            if self.on_lag is not None:
                self.report_lag(events)

    def report_lag(self, events: Sequence[Any]) -> None:
        next_offsets: dict[Any, int] = {}
        for event in events:
            tp = event.message.tp
            next_offsets[tp] = max(next_offsets.get(tp, 0), event.message.offset + 1)
        assigned = self.app.consumer.assignment()
        for tp, next_offset in next_offsets.items():
            if tp not in assigned:  # revoked meanwhile: its next owner reports it
                continue
            highwater = self.app.consumer.highwater(tp)
            if highwater is not None and self.on_lag is not None:
                self.on_lag(tp.partition, highwater - next_offset)

    async def sweep(self) -> None:
        """The timer: ``stage.sweep`` over the ``rewards`` partitions assigned now."""
        assigned = [tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.topic]
        async with self.lock:
            if self.stopping:
                return
            try:
                await self.stage.sweep(assigned)
            except Exception:
                log.exception("sweeping due groups failed; exiting so that a fresh worker takes over")
                _exit_now(EXIT_ON_ERROR)

    def request_stop(self) -> None:
        """SIGTERM/SIGINT: take no more batches and stop once the one in hand is done."""
        if self.stopping:
            _exit_now(1)  # second signal: go now
        self.stopping = True
        log.info("stop requested")
        asyncio.ensure_future(self.stop())

    async def stop(self) -> NoReturn:
        """Between batches: commit what Faust acked (all of it stored), exit 0."""
        async with self.lock:
            try:
                await asyncio.wait_for(self.app.consumer.commit(), timeout=COMMIT_ON_STOP_TIMEOUT_S)
            except (TimeoutError, AIOKafkaError, OSError) as exc:  # offsets only save replay: Redis holds the truth
                log.warning("commit on stop failed (%s); rewards since the last commit will be replayed", exc)
            log.info("stream worker stopped")
            _exit_now(0)


class _Worker(faust.Worker):
    """Faust worker whose SIGTERM/SIGINT stop between batches instead of Faust's shutdown."""

    driver: _Driver

    def _on_sigterm(self) -> None:
        self.driver.request_stop()

    def _on_sigint(self) -> None:
        self.driver.request_stop()


def _exit_now(code: int) -> NoReturn:
    """Exit without Faust's shutdown: it would ack the batch in hand (take_events acks in a
    ``finally``) and then commit past rewards that never reached Redis."""
    logging.shutdown()
    os._exit(code)
