"""Sharded checkpoints (learner/sharded_checkpoint.py) resume on a different rank count: 2 -> 1,
1 -> 2 (from today's single-process format) and 2 -> 2 on an S3 emulator, restoring model,
optimizer, scheduler, offsets and lineage exactly; the checkpoint's Hugging Face export loads
with plain transformers; a checkpoint without its commit marker does not count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rollstream.config import CheckpointConfig, Config, LearnerConfig, LoraConfig, OptimConfig
from rollstream.config_load import to_toml
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.weight_files import filesystem
from tests.learner.test_distributed import ROOT, torchrun

pytestmark = pytest.mark.integration  # processes under torchrun, an S3 emulator


def write_config(tmp_path: Path, name: str, model: str, ckpt_dir: str, parallel: str = "fsdp",
                 lora: bool = False) -> Path:
    config = Config(learner=LearnerConfig(
        model=model, micro_batch=2, parallel=parallel, optim=OptimConfig(lr=1e-2, warmup_steps=3),
        checkpoint=CheckpointConfig(dir=ckpt_dir), lora=LoraConfig(rank=4) if lora else None))
    path = tmp_path / f"{name}.toml"
    path.write_text(to_toml(config))
    return path


def launch(ranks: int, mode: str, config: Path, out: Path) -> dict:
    if ranks == 1:
        proc = subprocess.run([sys.executable, "-m", "tests.learner.dist_ckpt", mode, str(config), str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                                 "PYTHONPATH": str(ROOT)})
    else:
        proc = torchrun("tests.learner.dist_ckpt", mode, str(config), str(out), nproc=ranks)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return torch.load(out, weights_only=False)


def assert_same_state(saved: dict, resumed: dict) -> None:
    assert saved["model"].keys() == resumed["model"].keys()
    for name, tensor in saved["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    a, b = saved["optim"]["state"], resumed["optim"]["state"]
    assert a.keys() == b.keys() and a, "optimizer state"
    for name in a:
        for key, value in a[name].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(b[name][key])), (name, key)
    assert saved["lr"] == resumed["lr"]
    assert resumed["lineage"][:3] == [1, 1, 1] and resumed["lineage"][3] == ["s1"]
    assert resumed["offsets"] == {0: 5, 2: 9}


@pytest.mark.parametrize("lora", [False, True])
def test_two_ranks_to_one(tmp_path: Path, learner_model_dir: str, lora: bool) -> None:
    config = write_config(tmp_path, "c", learner_model_dir, str(tmp_path / "ckpt"), lora=lora)
    saved = launch(2, "save", config, tmp_path / "saved.pt")
    resumed = launch(1, "resume", config, tmp_path / "resumed.pt")
    assert sharded_ckpt.is_sharded(resumed["resumed_from"])
    assert_same_state(saved, resumed)
    if not lora:  # the export is the trained model, for plain transformers
        from transformers import AutoModelForCausalLM

        exported = AutoModelForCausalLM.from_pretrained(Path(resumed["resumed_from"]) / "model")
        for name, tensor in exported.state_dict().items():
            assert torch.equal(tensor, saved["model"][name]), name


def test_one_rank_single_process_checkpoint_to_two(tmp_path: Path, learner_model_dir: str) -> None:
    config = write_config(tmp_path, "c", learner_model_dir, str(tmp_path / "ckpt"))
    saved = launch(1, "save", config, tmp_path / "saved.pt")
    assert not sharded_ckpt.is_sharded(saved_dir := sharded_ckpt.latest_checkpoint(tmp_path / "ckpt"))
    assert (Path(saved_dir) / "trainer.pt").exists()  # today's format, as one process writes it
    resumed = launch(2, "resume", config, tmp_path / "resumed.pt")
    assert_same_state(saved, resumed)


def test_object_storage_ddp_to_fsdp_with_commit_marker(tmp_path: Path, learner_model_dir: str, s3_url: str) -> None:
    root = f"{s3_url}/run/ckpt"
    saved = launch(2, "save", write_config(tmp_path, "ddp", learner_model_dir, root, parallel="ddp"),
                   tmp_path / "saved.pt")
    fs, base = filesystem(root)
    [step] = [p for p in fs.ls(base, detail=False) if p.rsplit("/", 1)[-1].startswith("step-")]
    assert fs.exists(f"{step}/COMMIT") and fs.exists(f"{step}/shards/.metadata")
    # a newer checkpoint whose writer died before its commit marker does not count
    fs.pipe_file(f"{base}/step-00000009-g0000000009/state.json", b"{}")
    fs.pipe_file(f"{base}/step-00000009-g0000000009/shards/.metadata", b"torn")
    fs.pipe_file(f"{base}/latest", b"step-00000009-g0000000009\n")
    assert sharded_ckpt.latest_checkpoint(root) == fs.unstrip_protocol(step)
    resumed = launch(2, "resume", write_config(tmp_path, "fsdp", learner_model_dir, root), tmp_path / "resumed.pt")
    assert_same_state(saved, resumed)
    from transformers import AutoModelForCausalLM

    fs.get(f"{step}/model", str(tmp_path / "export"), recursive=True)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, saved["model"][name]), name


def test_one_rank_on_object_storage_writes_the_sharded_format(tmp_path: Path, learner_model_dir: str,
                                                              s3_url: str) -> None:
    """One process cannot rename on object storage either: with a URL it writes the sharded format
    too (without torch.distributed), which two ranks resume."""
    root = f"{s3_url}/one/ckpt"
    saved = launch(1, "save", write_config(tmp_path, "one", learner_model_dir, root), tmp_path / "saved.pt")
    location = sharded_ckpt.latest_checkpoint(root)
    assert location is not None and location.startswith("s3://") and sharded_ckpt.is_sharded(location)
    resumed = launch(2, "resume", write_config(tmp_path, "two", learner_model_dir, root), tmp_path / "resumed.pt")
    assert_same_state(saved, resumed)
