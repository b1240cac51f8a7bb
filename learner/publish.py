"""What a publish needs besides the weight store: the gathered tensors as an async stream, and
the memory the publish adds to its process."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

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
