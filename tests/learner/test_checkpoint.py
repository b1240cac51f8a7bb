"""Checkpoints: atomic, loadable by transformers, and resuming reproduces uninterrupted training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from rollstream.config import CheckpointConfig, Config, LearnerConfig, LoraConfig, OptimConfig
from rollstream.errors import CheckpointError
from rollstream.learner import checkpoint as ckpt
from rollstream.learner.lora import merged_state_dict
from rollstream.learner.train import build_trainer
from tests.helpers import group

pytestmark = pytest.mark.unit


def make_config(model_dir: str, ckpt_dir: Path, *, lora: bool = False, warmup_steps: int = 0) -> Config:
    return Config(learner=LearnerConfig(model=model_dir, micro_batch=2, checkpoint=CheckpointConfig(dir=str(ckpt_dir)),
                                        optim=OptimConfig(lr=1e-2, warmup_steps=warmup_steps),
                                        lora=LoraConfig(rank=4) if lora else None))


def save(trainer, config: Config, step: int, groups: int, offsets: dict[int, int] | None = None) -> Path:
    state = ckpt.CheckpointState(step=step, policy_version=step, groups_consumed=groups, offsets=offsets or {},
                                 lora=config.learner.lora is not None)
    merged = merged_state_dict(trainer.model) if config.learner.lora is not None else None
    return ckpt.save_checkpoint(config.learner.checkpoint.dir, state, model=trainer.model, tokenizer=None,
                                optimizer=trainer.optimizer, scheduler=trainer.scheduler, merged_weights=merged)


@pytest.mark.parametrize("lora", [False, True])
def test_resume_reproduces_uninterrupted_training(learner_model_dir: str, tmp_path: Path, lora: bool) -> None:
    steps = [group(f"s{i}", [1.0, -1.0, 0.5], seed=i).rollouts for i in range(3)]
    straight_cfg = make_config(learner_model_dir, tmp_path / "a", lora=lora, warmup_steps=2)
    straight, *_ = build_trainer(straight_cfg, None)
    for rollouts in steps:
        straight.step(rollouts)

    cfg = make_config(learner_model_dir, tmp_path / "b", lora=lora, warmup_steps=2)
    first, *_ = build_trainer(cfg, None)
    first.step(steps[0])
    path = save(first, cfg, step=1, groups=1, offsets={0: 7, 3: 2})
    first.step(steps[1])  # progress after the checkpoint is lost with the process
    resumed, _, lineage, offsets = build_trainer(cfg, ckpt.latest_checkpoint(cfg.learner.checkpoint.dir))
    assert ckpt.latest_checkpoint(cfg.learner.checkpoint.dir) == path
    assert (lineage.step, lineage.version, lineage.groups_consumed, offsets) == (1, 1, 1, {0: 7, 3: 2})
    for rollouts in steps[1:]:
        resumed.step(rollouts)
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr()


def test_model_directory_loads_with_transformers(learner_model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    for lora in (False, True):
        cfg = make_config(learner_model_dir, tmp_path / f"c{lora}", lora=lora)
        trainer, *_ = build_trainer(cfg, None)
        trainer.step(group("g", [1.0, -1.0], seed=5).rollouts)
        path = save(trainer, cfg, step=1, groups=1)
        loaded = AutoModelForCausalLM.from_pretrained(path / "model")
        expected = merged_state_dict(trainer.model)
        got = loaded.state_dict()
        assert set(expected) <= set(got)
        for name, value in expected.items():
            assert torch.allclose(got[name], value, atol=1e-6), name
        ids = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            assert torch.allclose(loaded(ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)
        assert (path / "adapter").exists() == lora


def test_pointer_moves_only_to_complete_checkpoints_and_old_ones_are_pruned(learner_model_dir: str,
                                                                            tmp_path: Path) -> None:
    cfg = make_config(learner_model_dir, tmp_path / "d")
    trainer, *_ = build_trainer(cfg, None)
    root = Path(cfg.learner.checkpoint.dir)
    assert ckpt.latest_checkpoint(root) is None
    paths = [save(trainer, cfg, step=s, groups=2 * s) for s in (1, 2, 3)]
    assert ckpt.latest_checkpoint(root) == paths[-1]
    assert sorted(p.name for p in root.glob("step-*")) == [p.name for p in paths[1:]]  # keep = 2
    # A crash mid-write leaves only a .tmp directory: latest still names the last complete one.
    (root / ".tmp-step-00000004-g0000000008-1-1").mkdir()
    assert ckpt.latest_checkpoint(root) == paths[-1]
    # A failing write removes its temporary directory and keeps the pointer.
    class Broken(torch.optim.SGD):
        def state_dict(self):  # type: ignore[override]
            raise OSError("disk full")

    with pytest.raises(OSError):
        ckpt.save_checkpoint(root, ckpt.CheckpointState(step=5, policy_version=5, groups_consumed=10),
                             model=trainer.model, tokenizer=None,
                             optimizer=Broken(trainer.model.parameters(), lr=0.1), scheduler=trainer.scheduler)
    assert ckpt.latest_checkpoint(root) == paths[-1]
    assert not list(root.glob(".tmp-step-00000005*"))
    (root / ckpt.LATEST).write_text("step-99999999-g0000000000\n")
    with pytest.raises(CheckpointError):
        ckpt.latest_checkpoint(root)


def test_state_json_roundtrip_and_rng(tmp_path: Path) -> None:
    state = ckpt.CheckpointState(step=3, policy_version=3, groups_consumed=12, offsets={2: 9, 0: 4}, topic="t")
    assert ckpt.CheckpointState.from_json(state.to_json()) == state
    saved = ckpt.rng_state()
    a = torch.rand(3)
    ckpt.set_rng_state(saved)
    assert torch.equal(torch.rand(3), a)


def test_step_log_appends(tmp_path: Path) -> None:
    ckpt.append_step_log(tmp_path, {"step": 1, "groups": ["a"]})
    ckpt.append_step_log(tmp_path, {"step": 2, "groups": ["b"]})
    assert [r["step"] for r in ckpt.read_step_log(tmp_path)] == [1, 2]
    assert os.path.exists(tmp_path / ckpt.STEP_LOG)


def test_lora_broadcast_merged_equals_a_merged_model(learner_model_dir: str, tmp_path: Path) -> None:
    cfg = make_config(learner_model_dir, tmp_path / "e", lora=True)
    trainer, *_ = build_trainer(cfg, None)
    trainer.step(group("g", [1.0, -1.0], seed=7).rollouts)
    merged = dict(trainer.named_weights(torch.bfloat16))  # what a publish streams
    assert all(t.dtype == torch.bfloat16 for t in merged.values())
    assert not any("lora" in k or "base_layer" in k for k in merged)
    exact = merged_state_dict(trainer.model)  # fp32
    reference = trainer.model.merge_and_unload()  # peft's own merge (modifies the model: done last)
    for name, value in reference.state_dict().items():
        if name in merged:
            assert torch.allclose(exact[name], value, atol=1e-6), name
    assert set(reference.state_dict()) - set(merged) <= {"lm_head.weight"}  # tied, sent once
