"""The file data plane of the weight store (rollstream/weight_files.py): versions as safetensors
directories on a local filesystem and on an S3 emulator, Redis keeping manifest, version and
announcement; what transformers and both generator backends load from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollstream.config import InfraConfig, WeightsConfig
from rollstream.consumers.generator.backends.hf import TransformersBackend
from rollstream.errors import WeightStoreError
from rollstream.redis import connect
from rollstream.weight_files import FileWeightStore, VersionFiles, open_weight_store
from rollstream.weights import WeightStore, aiter_items
from tests.helpers import tiny_model

pytestmark = pytest.mark.integration


def weights(seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    model = tiny_model(seed)
    return model, {k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if k != "lm_head.weight"}


@pytest.fixture
async def redis(infra_config: InfraConfig):
    client = connect(infra_config.redis_url)
    yield client
    await client.aclose()


async def publish(store: WeightStore, version: int, state: dict[str, torch.Tensor], model: torch.nn.Module):
    return await store.publish_stream(version, aiter_items(state), step=version,
                                      files={"config.json": model.config.to_json_string().encode()})


@pytest.mark.parametrize("file_bytes", [1 << 20, 4096])  # one file; a file per few tensors
async def test_local_versions_load_as_they_are(redis, infra_config: InfraConfig, tmp_path: Path,
                                               file_bytes: int) -> None:
    from transformers import AutoModelForCausalLM

    store = FileWeightStore(redis, str(tmp_path / "w"), key_prefix=infra_config.key_prefix, file_bytes=file_bytes,
                            keep_versions=2, expire_grace_s=0)
    model, state = weights()
    published = await publish(store, 1, state, model)
    assert published.manifest_key.endswith("v1:files") and await store.latest_version() == 1
    version, files = await store.fetch()
    assert version == 1 and isinstance(files, VersionFiles) and files.local_dir == str(tmp_path / "w" / "v00000001")
    assert list(files) == list(state) and all(torch.equal(files[k], v) for k, v in state.items())
    names = sorted(p.name for p in Path(files.local_dir).iterdir())
    if file_bytes > 4096:
        assert names == ["config.json", "model.safetensors"]
    else:
        assert "model.safetensors.index.json" in names and len(names) > 4
    loaded = AutoModelForCausalLM.from_pretrained(files.local_dir, dtype=torch.bfloat16)  # as it is
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    assert torch.equal(loaded.lm_head.weight, state["model.embed_tokens.weight"])  # tied


async def test_a_corrupted_or_missing_file_loads_nothing_and_old_versions_go(redis, infra_config: InfraConfig,
                                                                             tmp_path: Path) -> None:
    store = FileWeightStore(redis, str(tmp_path), key_prefix=infra_config.key_prefix, file_bytes=1 << 20,
                            keep_versions=1, expire_grace_s=0)
    model, state = weights()
    await publish(store, 1, state, model)
    target = tmp_path / "v00000001" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(WeightStoreError, match="corrupted"):
        await store.fetch(1)
    target.unlink()
    with pytest.raises(WeightStoreError, match="missing"):
        await store.fetch(1)
    for version in (2, 3, 4):
        await publish(store, version, state, model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00000003", "v00000004"]  # keys: 1, files: 1 later
    with pytest.raises(WeightStoreError, match="no manifest"):
        await store.fetch(3)
    assert (await store.fetch(4))[0] == 4


async def test_s3_versions_round_trip_and_download(redis, infra_config: InfraConfig, s3_url: str,
                                                   tmp_path: Path) -> None:
    store = open_weight_store(redis, key_prefix=infra_config.key_prefix,
                              settings=WeightsConfig(store=f"{s3_url}/weights", file_shard_bytes=1 << 20))
    assert isinstance(store, FileWeightStore)
    model, state = weights()
    await publish(store, 5, state, model)
    version, files = await store.fetch()
    assert version == 5 and files.local_dir is None
    assert all(torch.equal(files[k], v) for k, v in state.items())
    local = Path(files.download_to(str(tmp_path / "dl")))
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "model.safetensors"]


async def test_both_generator_backends_load_from_a_file_store(redis, infra_config: InfraConfig, tmp_path: Path,
                                                              tiny_model_dir: Path) -> None:
    from tests.consumers.generator.test_sglang_backend import FakeSGLang, _backend

    store = FileWeightStore(redis, str(tmp_path / "w"), key_prefix=infra_config.key_prefix, file_bytes=1 << 20)
    hf = TransformersBackend.load(str(tiny_model_dir), dtype=torch.bfloat16)
    state = {k: (v.float() + 0.01).to(torch.bfloat16) for k, v in hf.model.state_dict().items()
             if k != "lm_head.weight"}
    await publish(store, 2, state, hf.model)
    _, files = await store.fetch()
    await hf.load_weights(2, await hf.prepare_weights(files))
    assert hf.policy_version == 2
    assert all(torch.equal(hf.model.state_dict()[k], v) for k, v in state.items())
    fake = FakeSGLang()
    sglang = _backend(fake, tmp_path)
    await sglang.load_weights(2, files)
    assert fake.update_bodies[-1]["model_path"] == files.local_dir  # the store's directory, as it is
    assert all(torch.equal(fake.loaded[k], v) for k, v in state.items())
    assert Path(files.local_dir).is_dir()  # not pruned: the store owns it
    await sglang.aclose()
