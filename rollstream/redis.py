"""Redis connection and the small shared state the stages coordinate through.

Keys (all under ``infra.key_prefix``):

* ``policy:version`` — the learner's policy version (= optimizer steps of the surviving
  lineage). Written by the learner, read by the sampler and generators.
* ``progress:groups_consumed`` — groups the learner has taken off ``advantages`` (trained or
  dropped as stale), as an absolute count restored from its checkpoint, so a replay
  after a crash never double counts.
* ``progress:groups_dropped`` — a set of group ids the stream dropped (filtered or
  incomplete): they will never reach the learner. A set, so re-processing is idempotent.

* ``sampler:issued`` — groups the sampler has issued (acknowledged by the broker).

The sampler's backpressure reads ``issued - consumed - |dropped|``.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from rollstream.config import InfraConfig


def connect(url: str) -> aioredis.Redis:
    """A client for ``url``; the caller closes it (``await client.aclose()``)."""
    return aioredis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)


def key(infra: InfraConfig, name: str) -> str:
    return f"{infra.key_prefix}{name}"


async def get_policy_version(client: aioredis.Redis, infra: InfraConfig) -> int:
    value = await client.get(key(infra, "policy:version"))
    return int(value) if value is not None else 0


async def set_policy_version(client: aioredis.Redis, infra: InfraConfig, version: int) -> None:
    await client.set(key(infra, "policy:version"), version)


async def set_groups_consumed(client: aioredis.Redis, infra: InfraConfig, count: int) -> None:
    await client.set(key(infra, "progress:groups_consumed"), count)


async def mark_group_dropped(client: aioredis.Redis, infra: InfraConfig, group_id: str) -> None:
    await client.sadd(key(infra, "progress:groups_dropped"), group_id)


async def groups_resolved(client: aioredis.Redis, infra: InfraConfig) -> int:
    """Groups that will never be waited for again: consumed by the learner or dropped by the stream."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.get(key(infra, "progress:groups_consumed"))
        pipe.scard(key(infra, "progress:groups_dropped"))
        consumed, dropped = await pipe.execute()
    return int(consumed or 0) + int(dropped or 0)


async def groups_issued(client: aioredis.Redis, infra: InfraConfig) -> int:
    return int(await client.get(key(infra, "sampler:issued")) or 0)


async def delete_prefix(client: aioredis.Redis, prefix: str) -> int:
    """Delete every key starting with ``prefix`` (tests, benchmarks and runs clean up with it)."""
    keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    if keys:
        await client.delete(*keys)
    return len(keys)
