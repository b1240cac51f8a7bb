"""Redis connection and the small shared state the stages coordinate through.

Keys (all under ``infra.key_prefix``):

* ``policy:version`` — the learner's policy version: its one reader and writer are in
  :mod:`rollstream.weights` (``learner_version``), with the newest published weights' version.
* ``progress:groups_consumed`` — groups the learner has taken off ``advantages`` (trained,
  filtered or dropped), as an absolute count restored from its checkpoint, so a replay
  after a crash never double counts; groups trained into a version not yet published are
  left out until it is (so the sampler's next groups are generated with that version).
* ``progress:groups_dropped`` — a set of the group ids the stream dropped as incomplete (fewer
  than ``min_group_size`` rollouts by the deadline): they never reach the learner. A set, so
  re-processing is idempotent.
* ``progress:groups`` — a hash of the learner's counts in the one vocabulary of outcomes
  (``schemas.events.group_outcome``): ``trained``, ``filtered``, ``dropped:<reason>`` (progress
  lines; the ``fates`` topic is the record).
* ``sampler:issued`` — groups the sampler has issued (acknowledged by the broker).

The sampler's backpressure reads ``issued - consumed - |dropped|``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

import redis.asyncio as aioredis

from rollstream.config import InfraConfig
from rollstream.weights import LEARNER_VERSION

# A command whose connection fails is retried on a new connection with backoff (0.1 s doubling to
# 1 s, about 10 s in all), so a Redis restart costs the stages a pause, not a crash (bench/chaos.py
# restarts it mid-run). What the stages send is idempotent or, where it counts (progress
# counters), only approximate.
RETRIES = 12


def connect(url: str, retries: int = RETRIES) -> aioredis.Redis:
    """A client for ``url``; the caller closes it (``await client.aclose()``)."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return aioredis.Redis.from_url(
        url, socket_connect_timeout=5, health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, OSError])


def key(infra: InfraConfig, name: str) -> str:
    return f"{infra.key_prefix}{name}"


async def set_groups_consumed(client: aioredis.Redis, infra: InfraConfig, count: int) -> None:
    await client.set(key(infra, "progress:groups_consumed"), count)


async def count_outcomes(client: aioredis.Redis, infra: InfraConfig, counts: Mapping[str, int]) -> None:
    """Add to the learner's progress counts: ``{"trained": n, "filtered": m, "dropped:stale": k}``."""
    async with client.pipeline(transaction=False) as pipe:
        for name, count in counts.items():
            if count:
                pipe.hincrby(key(infra, "progress:groups"), name, count)
        await pipe.execute()


class Progress(TypedDict):
    issued: int
    trained: int
    filtered: int
    dropped: dict[str, int]  # by reason: the learner's (stale, duplicate, invalid) and the stream's (incomplete)
    version: int  # the learner's


async def progress(client: aioredis.Redis, infra: InfraConfig) -> Progress:
    """Groups issued, trained, filtered and dropped by reason, and the learner's version."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.get(key(infra, "sampler:issued"))
        pipe.hgetall(key(infra, "progress:groups"))
        pipe.scard(key(infra, "progress:groups_dropped"))
        pipe.get(key(infra, LEARNER_VERSION))
        issued, learner, incomplete, version = await pipe.execute()
    counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in learner.items()}
    dropped = {name.split(":", 1)[1]: n for name, n in counts.items() if name.startswith("dropped:")}
    if incomplete:
        dropped["incomplete"] = int(incomplete)
    return Progress(issued=int(issued or 0), trained=counts.get("trained", 0), filtered=counts.get("filtered", 0),
                    dropped=dict(sorted(dropped.items())), version=int(version or 0))


async def mark_group_dropped(client: aioredis.Redis, infra: InfraConfig, group_id: str) -> None:
    await client.sadd(key(infra, "progress:groups_dropped"), group_id)


async def groups_resolved(client: aioredis.Redis, infra: InfraConfig) -> int:
    """Groups that will never be waited for again: consumed by the learner or dropped by the stream."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.get(key(infra, "progress:groups_consumed"))
        pipe.scard(key(infra, "progress:groups_dropped"))
        consumed, dropped = await pipe.execute()
    return int(consumed or 0) + int(dropped or 0)


async def delete_prefix(client: aioredis.Redis, prefix: str) -> int:
    """Delete every key starting with ``prefix`` (tests, benchmarks and runs clean up with it)."""
    keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)
    return len(keys)
