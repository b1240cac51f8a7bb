"""Bounded exponential backoff for I/O boundaries."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


async def retry(
    action: Callable[[], Awaitable[T]],
    *,
    what: str,
    attempts: int = 6,
    first_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    retry_on: tuple[type[BaseException], ...] = (OSError, ConnectionError, asyncio.TimeoutError),
) -> T:
    """Run ``action``; on ``retry_on`` errors wait 0.2, 0.4, ... s (jittered, capped) and try again.

    The last error propagates after ``attempts`` tries.
    """
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return await action()
        except retry_on as exc:
            if attempt == attempts:
                raise
            log.warning("%s failed (attempt %d/%d): %s; retrying in %.1fs", what, attempt, attempts, exc, delay)
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, max_delay_s)
    raise AssertionError("unreachable")
