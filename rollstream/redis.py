"""Redis connection and the small shared state the stages coordinate through.

Keys (all under ``infra.key_prefix``):

* ``policy:version`` — the learner's policy version (= optimizer steps of the surviving
  lineage). Written by the learner, read by the sampler and generators.
* ``progress:groups_consumed`` — groups the learner has taken off ``advantages`` (trained or
  dropped as stale), as an absolute count restored from its checkpoint, so a replay
  after a crash never double counts; groups trained into a version not yet published are
  left out until it is (so the sampler's next groups are generated with that version).
* ``progress:groups_dropped`` — a set of group ids the stream dropped (filtered or
  incomplete): they will never reach the learner. A set, so re-processing is idempotent.

* ``progress:groups_trained`` / ``progress:groups_stale`` — groups the learner trained on /
  dropped because all their rollouts were too stale (counters for progress lines; the learner's
  metrics and step log are the record).
* ``sampler:issued`` — groups the sampler has issued (acknowledged by the broker).

The sampler's backpressure reads ``issued - consumed - |dropped|``.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from rollstream.config import InfraConfig

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


async def get_policy_version(client: aioredis.Redis, infra: InfraConfig) -> int:
    value = await client.get(key(infra, "policy:version"))
    return int(value) if value is not None else 0


async def set_policy_version(client: aioredis.Redis, infra: InfraConfig, version: int) -> None:
    await client.set(key(infra, "policy:version"), version)


async def set_groups_consumed(client: aioredis.Redis, infra: InfraConfig, count: int) -> None:
    await client.set(key(infra, "progress:groups_consumed"), count)


async def count_outcomes(client: aioredis.Redis, infra: InfraConfig, outcomes: dict[str, int]) -> None:
    """Add to the learner's progress counters (``{"trained": n, "stale": m}``)."""
    async with client.pipeline(transaction=False) as pipe:
        for outcome, count in outcomes.items():
            if count:
                pipe.incrby(key(infra, f"progress:groups_{outcome}"), count)
        await pipe.execute()


async def progress(client: aioredis.Redis, infra: InfraConfig) -> dict[str, int]:
    """Issued, trained, stale (learner) and filtered (stream) groups, and the policy version."""
    names = ("sampler:issued", "progress:groups_trained", "progress:groups_stale", "policy:version")
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(key(infra, name))
        pipe.scard(key(infra, "progress:groups_dropped"))
        values = await pipe.execute()
    counts = dict(zip(("issued", "trained", "stale", "version", "filtered"), (int(v or 0) for v in values)))
    return counts


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
