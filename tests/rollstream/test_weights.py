"""Weight store against the real Redis: exact round trips, corruption, expiry, announcements."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import torch

from rollstream.config import InfraConfig
from rollstream.errors import WeightStoreError
from rollstream.redis import connect
from rollstream.weights import (
    ChunkEntry,
    Manifest,
    WeightStore,
    learner_version,
    pack,
    published_version,
    set_learner_version,
    unpack,
)
from tests.helpers import wait_until


def _random_state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(100, 33, generator=gen),
        "layer.0.bias": torch.randn(7, generator=gen).to(torch.bfloat16),
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(3.5),
        "steps": torch.arange(11, dtype=torch.int64),
    }


@pytest.mark.unit
@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
def test_pack_unpack_is_exact_for_any_chunk_size(chunk_bytes: int) -> None:
    state = _random_state()
    entries, chunks = pack(state, chunk_bytes)
    assert all(0 < c.nbytes <= chunk_bytes for c in chunks)
    assert sum(c.nbytes for c in chunks) == sum(t.numel() * t.element_size() for t in state.values())
    manifest = Manifest(version=1, step=1, dtype="mixed", total_bytes=sum(c.nbytes for c in chunks),
                        tensors=entries, chunks=[ChunkEntry(nbytes=c.nbytes, digest="") for c in chunks],
                        created_at=0.0)
    out = unpack(manifest, [bytes(c) for c in chunks])
    assert list(out) == list(state)
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor)


@pytest.fixture
async def store(infra_config: InfraConfig):
    client = connect(infra_config.redis_url)
    yield WeightStore(client, key_prefix=infra_config.key_prefix, chunk_bytes=4096, keep_versions=2,
                      expire_grace_s=0)
    await client.aclose()


@pytest.mark.integration
async def test_round_trip_and_latest(store: WeightStore) -> None:
    state = _random_state()
    published = await store.publish(3, state, step=3)
    assert published.version == 3 and published.num_bytes > 0
    assert await store.latest_version() == 3
    version, out = await store.fetch()
    assert version == 3
    assert all(torch.equal(out[k], v) for k, v in state.items())


@pytest.mark.integration
async def test_the_two_version_facts_have_one_key_and_reader_each(store: WeightStore, infra_config: InfraConfig) -> None:
    """The learner's version and the newest published weights are separate facts: publishing moves
    only the second; the learner sets the first; a fresh prefix reads 0 and None."""
    client, prefix = store.client, infra_config.key_prefix
    assert await learner_version(client, prefix) == 0
    assert await published_version(client, prefix) is None
    await store.publish(4, _random_state(), step=4)
    assert await published_version(client, prefix) == 4 == await store.latest_version()
    assert await learner_version(client, prefix) == 0  # moved by the learner only
    await set_learner_version(client, prefix, 5)
    assert await learner_version(client, prefix) == 5 and await published_version(client, prefix) == 4


@pytest.mark.unit
def test_the_version_facts_and_the_sampler_need_no_torch() -> None:
    """A stage without a model (the sampler) reads the version facts without importing torch."""
    code = ("import sys, rollstream.weights, rollstream.producers.sampler; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from rollstream.weights import DTYPES; assert 'torch' in sys.modules and DTYPES['bfloat16']")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.integration
async def test_corrupted_or_missing_chunk_loads_nothing(store: WeightStore) -> None:
    await store.publish(1, _random_state(), step=1)
    key = store._chunk_key(1, 2)
    good = await store.client.get(key)
    await store.client.set(key, bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(WeightStoreError, match="chunk 2 is corrupted"):
        await store.fetch(1)
    await store.client.delete(key)
    with pytest.raises(WeightStoreError, match="chunk 2 is missing"):
        await store.fetch(1)
    with pytest.raises(WeightStoreError, match="no manifest"):
        await store.fetch(99)


@pytest.mark.unit
def test_pack_sends_tensor_memory_without_copying() -> None:
    tensor = torch.arange(1000, dtype=torch.float32)
    _, chunks = pack({"t": tensor}, 1024)
    tensor[0] = 42.0  # the chunks are views of the tensor's own memory
    assert bytes(chunks[0][:4]) == tensor[:1].numpy().tobytes()


@pytest.mark.integration
async def test_manifest_of_another_format_is_a_clear_error(store: WeightStore) -> None:
    await store.client.set(store._manifest_key(7), b"\x81\xa3old\x01")
    with pytest.raises(WeightStoreError, match="unreadable manifest"):
        await store.fetch(7)


@pytest.mark.integration
async def test_keeps_only_the_last_versions(store: WeightStore) -> None:
    for v in range(1, 5):
        await store.publish(v, _random_state(v), step=v)
    assert await store.client.get(store._manifest_key(2)) is None
    assert await store.client.get(store._chunk_key(2, 0)) is None
    for v in (3, 4):
        version, out = await store.fetch(v)
        assert torch.equal(out["embed.weight"], _random_state(v)["embed.weight"])


@pytest.mark.integration
async def test_updates_announce_new_versions(store: WeightStore) -> None:
    seen: list[int] = []

    async def follow() -> None:
        async for version in store.updates(poll_s=0.2):
            seen.append(version)
            if version == 2:
                return

    async def subscribed() -> bool:
        return (await store.client.pubsub_numsub(store.channel))[0][1] >= 1

    task = asyncio.create_task(follow())
    await wait_until(subscribed, "the follower subscribed")
    await store.publish(1, _random_state(), step=1)
    await wait_until(lambda: seen == [1] or task.done(), "version 1 announced")
    await store.publish(2, _random_state(), step=2)
    await asyncio.wait_for(task, 10)
    assert seen == [1, 2]


@pytest.mark.unit
async def test_an_unreachable_redis_is_a_weight_store_error() -> None:
    nowhere = connect("redis://127.0.0.1:1", retries=0)  # nothing listens on port 1
    store = WeightStore(nowhere, key_prefix="unreachable:")
    try:
        with pytest.raises(WeightStoreError, match="reading the latest weights version failed: Connection"):
            await store.fetch()
        with pytest.raises(WeightStoreError, match="publishing weights version 1 failed: ConnectionError"):
            await store.publish(1, _random_state(), step=1)
        with pytest.raises(WeightStoreError, match="subscribing to weight announcements failed"):
            async for _ in store.updates(poll_s=0.1):
                pass
    finally:
        await nowhere.aclose()


@pytest.fixture(scope="module")
def smollm2_state() -> dict[str, torch.Tensor]:
    from rollstream.models import load_model

    return load_model("smollm2").state_dict()


@pytest.mark.integration
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
async def test_real_model_round_trip_bit_exact(
    infra_config: InfraConfig, smollm2_state: dict[str, torch.Tensor], dtype: torch.dtype
) -> None:
    """SmolLM2-135M-Instruct's state dict through Redis, compared bit for bit."""
    state = {k: v.to(dtype) for k, v in smollm2_state.items()}
    client = connect(infra_config.redis_url)
    try:
        store = WeightStore(client, key_prefix=infra_config.key_prefix, expire_grace_s=0)
        await store.publish(1, state, step=1)
        _, out = await store.fetch(1)
    finally:
        await client.aclose()
    assert list(out) == list(state)
    for name, tensor in state.items():
        assert torch.equal(out[name].view(torch.uint8), tensor.contiguous().view(torch.uint8)), name


@pytest.mark.integration
async def test_a_redis_restart_is_a_pause_not_an_error(tmp_path) -> None:
    """The stages' client retries on a new connection: a command sent while Redis restarts (append-only
    persistence) succeeds once it is back, and sees what was written before."""
    import asyncio

    from rollstream.cli.chaos import PrivateRedis
    from rollstream.infra import free_port

    server = PrivateRedis(tmp_path / "redis", free_port())
    server.start()
    client = connect(server.url)
    try:
        await client.set("before", b"1")
        server.kill()
        restart = asyncio.get_running_loop().run_in_executor(None, server.start)
        assert await client.get("before") == b"1"  # retried until the server is back
        await restart
    finally:
        await client.aclose()
        server.kill()
