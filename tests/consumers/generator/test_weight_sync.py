"""Weight sync: prefetch, swap between batches, keep serving on failures (fake store and real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rollstream.config import InfraConfig
from rollstream.consumers.generator.backends.hf import TransformersBackend
from rollstream.consumers.generator.weight_sync import WeightSync
from rollstream.errors import WeightStoreError
from rollstream.redis import connect
from rollstream.weights import WeightStore


class FlakyStore:
    """A store whose fetch fails ``failures`` times before it works."""

    def __init__(self, state: dict[str, torch.Tensor], version: int, failures: int) -> None:
        self.state, self.version, self.failures, self.fetches = state, version, failures, 0

    async def latest_version(self) -> int | None:
        return self.version

    async def fetch(self, version: int | None = None) -> tuple[int, dict[str, Any]]:
        self.fetches += 1
        if self.fetches <= self.failures:
            raise WeightStoreError("chunk 3 is corrupted (checksum mismatch)")
        return self.version, self.state

    async def updates(self, poll_s: float = 5.0) -> AsyncIterator[int]:
        yield self.version
        while True:
            await asyncio.sleep(3600)
            yield self.version


async def _until(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _perturbed(backend: TransformersBackend, scale: float = 0.05) -> dict[str, torch.Tensor]:
    return {k: v + scale for k, v in backend.model.state_dict().items()}


@pytest.mark.unit
async def test_failed_fetches_keep_serving_then_retry(tiny_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir))
    store = FlakyStore(_perturbed(backend), version=1, failures=2)
    sync = WeightSync(store, backend, poll_s=0.05, max_backoff_s=0.1)
    task = asyncio.create_task(sync.run())
    try:
        await _until(lambda: sync.ready_version == 1)
    finally:
        task.cancel()
    assert sync.fetch_failures == 2 and backend.policy_version == 0  # nothing swapped until asked
    assert await sync.apply_pending() == 1 and backend.policy_version == 1
    assert await sync.apply_pending() is None  # nothing pending any more


@pytest.mark.unit
async def test_a_refused_load_keeps_the_current_weights(tiny_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir))
    broken = _perturbed(backend)
    broken["model.norm.weight"] = torch.ones(7)
    sync = WeightSync(FlakyStore(broken, version=2, failures=0), backend, poll_s=0.05)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    await sync.load_initial()
    assert sync.load_failures == 1 and backend.policy_version == 0
    assert all(torch.equal(v, before[k]) for k, v in backend.model.state_dict().items())


@pytest.mark.integration
async def test_corrupt_version_in_redis_then_a_good_one(tiny_model_dir: Path, infra_config: InfraConfig) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir))
    redis = connect(infra_config.redis_url)
    store = WeightStore(redis, key_prefix=infra_config.key_prefix, chunk_bytes=16 << 10)
    sync = WeightSync(store, backend, poll_s=0.1, max_backoff_s=0.2)
    task = asyncio.create_task(sync.run())
    try:
        await store.publish(1, _perturbed(backend), step=1)
        await redis.set(store._chunk_key(1, 0), b"\x00" * 16)  # corrupt v1 after it was announced
        await _until(lambda: sync.fetch_failures >= 1)
        assert await sync.apply_pending() is None and backend.policy_version == 0
        good = _perturbed(backend, 0.1)
        await store.publish(2, good, step=2)
        await _until(lambda: sync.ready_version == 2)
        assert await sync.apply_pending() == 2
        assert torch.equal(backend.model.state_dict()["model.norm.weight"], good["model.norm.weight"])
    finally:
        task.cancel()
        await redis.aclose()


@pytest.mark.unit
@pytest.mark.parametrize("learner", [0, 1, 4])
async def test_staleness_gate(tiny_model_dir: Path, learner: int) -> None:
    """max_staleness 1: weights of the learner's own version generate; one version behind is
    already too old once the learner takes its next step, so it waits (the old gate let it by)."""
    backend = TransformersBackend.load(str(tiny_model_dir))
    store = FlakyStore(_perturbed(backend), version=4, failures=0)

    async def learner_version() -> int:
        return learner

    sync = WeightSync(store, backend, poll_s=0.05, max_staleness=1, learner_version=learner_version)
    if learner == 0:  # the learner's own version: no wait
        assert await sync.wait_until_fresh() < 0.5 and backend.policy_version == 0
        return
    task = asyncio.create_task(sync.run())
    try:
        held = await asyncio.wait_for(sync.wait_until_fresh(check_s=0.02), 20)
    finally:
        task.cancel()
    assert backend.policy_version == 4 and held > 0


@pytest.mark.unit
async def test_a_batch_catches_up_with_the_version_its_prompts_were_issued_at(tiny_model_dir: Path) -> None:
    """The learner publishes v3, then the sampler issues prompts at v3: before the generator has
    even heard of v3, its batch waits for it instead of sampling with v0."""
    backend = TransformersBackend.load(str(tiny_model_dir))
    store = FlakyStore(_perturbed(backend), version=3, failures=0)
    sync = WeightSync(store, backend, poll_s=3600)  # no announcement will come in time: catch_up asks
    task = asyncio.create_task(sync.run())
    try:
        assert await sync.catch_up(3, wait_s=10) == 3 and backend.policy_version == 3
        assert await sync.catch_up(2, wait_s=10) == 3  # already newer: nothing to do
        started = asyncio.get_running_loop().time()
        assert await sync.catch_up(10**9, wait_s=0.3) == 3  # a version the store does not have
        assert asyncio.get_running_loop().time() - started < 5 and sync.announced == 3  # not believed
    finally:
        task.cancel()


@pytest.mark.unit
async def test_a_batch_waits_briefly_for_a_fetch_in_progress(tiny_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir))

    fetched = asyncio.Event()  # set by the test: the fetch in progress ends only then

    class SlowStore(FlakyStore):
        async def fetch(self, version: int | None = None) -> tuple[int, dict[str, Any]]:
            await fetched.wait()
            return await super().fetch(version)

    sync = WeightSync(SlowStore(_perturbed(backend), version=1, failures=0), backend, poll_s=0.05)
    task = asyncio.create_task(sync.run())
    try:
        await _until(lambda: not sync._fetched.is_set())  # the fetch has started
        assert await sync.apply_pending(wait_s=0.0) is None  # no waiting: old weights
        asyncio.get_running_loop().call_soon(fetched.set)  # the fetch ends while the batch waits
        assert await sync.apply_pending(wait_s=10.0) == 1  # waits for the fetch, then swaps
    finally:
        task.cancel()


class DownStore(FlakyStore):
    """A store whose Redis is down: every read fails; ``updates`` fails ``failures`` times first."""

    def __init__(self, failures: int) -> None:
        super().__init__({}, version=3, failures=failures)
        self.reads = self.subscriptions = 0

    async def latest_version(self) -> int | None:
        self.reads += 1
        raise WeightStoreError("reading the latest weights version failed: ConnectionError")

    async def updates(self, poll_s: float = 5.0) -> AsyncIterator[int]:
        self.subscriptions += 1
        if self.subscriptions <= self.failures:
            raise WeightStoreError("subscribing to weight announcements failed: ConnectionError")
        yield self.version
        await asyncio.sleep(3600)


class Base:
    policy_version = 0


@pytest.mark.unit
async def test_initial_load_gives_up_after_its_attempts_and_keeps_the_base() -> None:
    store = DownStore(failures=0)
    sync = WeightSync(store, Base(), max_backoff_s=0.01)  # type: ignore[arg-type]
    await asyncio.wait_for(sync.load_initial(attempts=3), 5)
    assert store.reads == 3 and sync.announced == -1


@pytest.mark.unit
async def test_announcements_resubscribe_after_failures() -> None:
    store = DownStore(failures=2)
    sync = WeightSync(store, Base(), poll_s=0.01, max_backoff_s=0.02)  # type: ignore[arg-type]
    follower = asyncio.create_task(sync._follow())
    try:
        await _until(lambda: sync.announced == 3, timeout_s=5)
    finally:
        follower.cancel()
    assert store.subscriptions == 3
