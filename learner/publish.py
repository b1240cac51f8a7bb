"""Publishing the learner's weights: the gathered tensors streamed to the weight store, the
``WeightsPublished`` record, the learner's version in Redis, and what a publish needs around it.

:class:`Publisher` runs one publish at a time. With ``learner.overlap_publish`` (one rank) a
publish runs as a task while the next step's forward and backward run; that step's optimizer
update waits for :attr:`Publisher.weights_free`, so the store gets exactly the published
version's weights. A version the evaluator will measure is pinned in the store first (best
effort: never a reason to stop training). The publish's peak extra memory is measured
(:class:`PeakRSS`), the tensors reach the store through :func:`iterate_in_thread`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from rollstream.weights import set_learner_version

if TYPE_CHECKING:
    from rollstream.config import Config
    from rollstream.kafka import EventProducer
    from rollstream.learner.ledger import Ledger
    from rollstream.learner.metrics import LearnerMetrics
    from rollstream.learner.setup import Lineage
    from rollstream.weights import WeightStore

log = logging.getLogger(__name__)

T = TypeVar("T")
_DONE = object()
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


async def iterate_in_thread(make: Callable[[], Iterator[T]], depth: int = 2) -> AsyncIterator[T]:
    """The items of ``make()``, produced in a thread (gathers are blocking collectives) and
    handed over through a queue of ``depth``, so at most ``depth`` items wait at any time.
    Closing the stream early lets the thread run to its end (a gather must finish on every rank)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue(depth)
    slots = threading.Semaphore(depth)
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            for item in make():
                slots.acquire()
                loop.call_soon_threadsafe(queue.put_nowait, item)
        except BaseException as exc:  # handed to the consumer
            failure.append(exc)
        finally:
            slots.acquire()
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

    worker = loop.run_in_executor(None, produce)
    finished = False
    try:
        while True:
            item = await queue.get()
            slots.release()
            if item is _DONE:
                finished = True
                break
            yield item
    finally:
        while not finished:  # drain, so the producer (and the other ranks' gathers) can finish
            finished = await queue.get() is _DONE
            slots.release()
        await worker
    if failure:
        raise failure[0]


def rss_bytes() -> int:
    """Resident set size of this process (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class PeakRSS:
    """``with PeakRSS() as peak: ...``: ``peak.extra_bytes`` is the most the block's process RSS
    rose above where it started (sampled every ``interval_s`` in a thread)."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def extra_bytes(self) -> int:
        return max(0, self.peak - self.start)

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class Publisher:
    """Publishes the lineage's current version; ``overlap`` (one rank, a :class:`Trainer`): in the
    background of the next step."""

    def __init__(self, config: Config, trainer: Any, lineage: Lineage, producer: EventProducer, store: WeightStore,
                 redis: Any, metrics: LearnerMetrics, ledger: Ledger, *, overlap: bool) -> None:
        self.config, self.trainer, self.lineage, self.producer = config, trainer, lineage, producer
        self.store, self.redis, self.metrics, self.ledger = store, redis, metrics, ledger
        self.overlap = overlap
        self.publishing: asyncio.Task[None] | None = None
        self.weights_free = threading.Event()
        self.weights_free.set()
        if overlap:
            trainer.before_update = self.weights_free.wait

    async def publish(self, overlap: bool = False) -> None:
        """Publish this version's weights; ``overlap``: start it as a task and return (the next
        step trains meanwhile and waits for it before changing a weight). One publish at a time."""
        await self.done()
        if not overlap:
            await self.publish_now()
            return
        self.weights_free.clear()

        async def publish_then_release() -> None:
            try:
                await self.publish_now()
            finally:
                self.weights_free.set()
            await self.ledger.release()

        self.publishing = asyncio.create_task(publish_then_release())

    async def done(self) -> None:
        """Wait for an overlapped publish (its failure is raised here)."""
        task, self.publishing = self.publishing, None
        if task is not None:
            await task

    async def check(self) -> None:
        """Raise what failed an overlapped publish that has ended (a running one goes on)."""
        if self.publishing is not None and self.publishing.done():
            await self.done()

    async def abandon(self) -> None:
        """Cancel a publish still running (the stage is failing: do not leave it behind)."""
        if self.publishing is not None and not self.publishing.done():
            self.publishing.cancel()
            await asyncio.gather(self.publishing, return_exceptions=True)

    async def pin_for_evaluator(self, version: int) -> None:
        """Keep ``version`` in the weight store for the evaluator (it unpins it once read), unless
        ``eval.max_pinned`` versions already wait: then it expires as usual and the evaluator
        reports it skipped. Best effort: a failure here never stops training."""
        try:
            if len(await self.store.pinned()) < self.config.eval.max_pinned:
                await self.store.pin(version)
            else:
                log.warning("version %d is not kept for the evaluator: %d versions already wait for it", version,
                            self.config.eval.max_pinned)
        except Exception as exc:  # noqa: BLE001 (the evaluator then reports the version skipped)
            log.warning("could not keep version %d for the evaluator: %s", version, exc)

    async def publish_now(self) -> None:
        """Stream the weights to the store one tensor at a time (gathered across the ranks, LoRA
        merged, cast to ``broadcast_dtype``): the publishing rank holds a tensor (Redis store) or
        one file's worth (file store) besides the model; its peak extra memory is measured."""
        import torch

        started = time.perf_counter()
        dtype = getattr(torch, self.config.learner.broadcast_dtype)
        base = getattr(self.trainer.model, "get_base_model", lambda: self.trainer.model)()
        files = {"config.json": base.config.to_json_string().encode()}
        version = self.lineage.version
        if self.config.eval.evaluates(version, self.config.learner.max_steps):
            await self.pin_for_evaluator(version)
        with PeakRSS() as peak:
            published = await self.store.publish_stream(
                version, iterate_in_thread(lambda: self.trainer.named_weights(dtype)),
                step=self.lineage.step, files=files)
        await self.producer.send("policy", published)
        await set_learner_version(self.redis, self.config.infra.key_prefix, version)
        self.ledger.unpublished = 0
        self.metrics.broadcast_seconds.observe(time.perf_counter() - started)
        self.metrics.publish_peak_extra.set(peak.extra_bytes)
        log.info("published policy version %d (%d bytes; the publish added %.1f MB at its peak)", published.version,
                 published.num_bytes, peak.extra_bytes / 1e6)
