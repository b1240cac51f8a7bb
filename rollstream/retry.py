"""The one retry policy of rollstream: bounded exponential backoff with jitter, at I/O boundaries.

Two shapes, one delay sequence:

* :func:`retry` calls an action until it succeeds, at most ``attempts`` times, and lets the
  last error propagate. For calls that either work soon or should fail loudly (connect,
  generate, run a sandbox job, POST to a server).
* :class:`Backoff` is the delay sequence itself, for loops that never give up (poll, resubscribe):
  ``delay = backoff.next_delay()`` after a failure, ``backoff.reset()`` after a success.

Delays grow ``first_delay_s, first_delay_s * 2, ...`` up to ``max_delay_s``, a hard cap. Each is
jittered down by up to ``jitter`` of itself (0.5: between half and all of it), so that processes
that failed together do not come back in lockstep. A call site always names what it retries on;
third-party errors are turned into rollstream's own with :func:`rollstream.errors.converted`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class Backoff:
    """Growing, capped, jittered delays: see the module docstring. Pure (no clock, no sleep)."""

    def __init__(self, first_delay_s: float = 0.2, max_delay_s: float = 5.0, *, factor: float = 2.0,
                 jitter: float = 0.5, rand: Callable[[], float] = random.random) -> None:
        if first_delay_s < 0 or max_delay_s < 0 or factor < 1 or not 0 <= jitter <= 1:
            raise ValueError(f"bad backoff: first {first_delay_s}s, max {max_delay_s}s, factor {factor}, "
                             f"jitter {jitter}")
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.factor = factor
        self.jitter = jitter
        self._rand = rand  # [0, 1); tests pass a constant
        self._nominal = min(first_delay_s, max_delay_s)

    def next_delay(self) -> float:
        """The delay to wait before the next try (then the one after grows)."""
        nominal = self._nominal
        self._nominal = min(nominal * self.factor, self.max_delay_s)
        return nominal * (1.0 - self.jitter * self._rand())

    def reset(self) -> None:
        """After a success: the next failure waits ``first_delay_s`` again."""
        self._nominal = min(self.first_delay_s, self.max_delay_s)


async def retry(
    action: Callable[[], Awaitable[T]],
    *,
    what: str,
    retry_on: tuple[type[BaseException], ...],
    attempts: int = 6,
    first_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    jitter: float = 0.5,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Await ``action()``; on a ``retry_on`` error log it, wait (:class:`Backoff`) and try again.

    After ``attempts`` tries the last error propagates unchanged; any other error propagates at
    once. ``what`` names the action in the log (``"connect producer"``).
    """
    if attempts < 1:
        raise ValueError(f"{what}: attempts must be >= 1, got {attempts}")
    backoff = Backoff(first_delay_s, max_delay_s, jitter=jitter)
    for attempt in range(1, attempts + 1):
        try:
            return await action()
        except retry_on as exc:
            if attempt == attempts:
                raise
            delay = backoff.next_delay()
            log.warning("%s failed (attempt %d/%d): %s; retrying in %.1fs",
                        what, attempt, attempts, exc, delay)
            await sleep(delay)
    raise AssertionError("unreachable")
