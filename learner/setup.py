"""Building the learner's trainer: model, LoRA, tokenizer, the ranks' wrapping, and what a
checkpoint of either format restores (the lineage: step, version, groups, recent group ids).
Blocking: the stage runs it in a thread."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollstream.config import Config
from rollstream.cpus import pin
from rollstream.learner import checkpoint as ckpt
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.distributed import Ranks, parallelize
from rollstream.learner.lora import add_lora, pad_id_of
from rollstream.learner.trainer import TRAINERS, Trainer
from rollstream.models import load_model, load_tokenizer

RECENT_GROUPS = 20000  # group ids remembered (and checkpointed) to skip upstream duplicates


class RecentIds:
    """The last ``size`` ids, with O(1) membership."""

    def __init__(self, size: int = RECENT_GROUPS) -> None:
        self.order: deque[str] = deque()
        self.members: set[str] = set()
        self.size = size

    def __contains__(self, item: str) -> bool:
        return item in self.members

    def extend(self, items: Any) -> None:
        for item in items:
            if item in self.members:
                continue
            self.order.append(item)
            self.members.add(item)
            if len(self.order) > self.size:
                self.members.discard(self.order.popleft())

    def __iter__(self) -> Any:
        return iter(self.order)


@dataclass
class Lineage:
    """What the checkpoint carries besides weights and optimizer."""

    step: int = 0
    version: int = 0
    groups_consumed: int = 0
    recent: RecentIds = field(default_factory=RecentIds)


def build_trainer(config: Config, resume_from: str | Path | None,
                  ranks: Ranks | None = None) -> tuple[Trainer, Any, Lineage, dict[int, int]]:
    """Model, tokenizer and trainer, restored from ``resume_from`` when given (blocking: run in a
    thread). With ``ranks`` the model is wrapped (DDP) or sharded (FSDP) first; a checkpoint of
    either format resumes on any rank count."""
    c = config.learner
    pin(c.cpus, "learner")
    if c.torch_threads:
        torch.set_num_threads(c.torch_threads)
    torch.manual_seed(config.rl.seed)
    location = str(resume_from) if resume_from is not None else None
    sharded = location is not None and sharded_ckpt.is_sharded(location)
    state = None
    if location is not None:
        state = sharded_ckpt.load_state(location) if sharded else ckpt.load_state(location)
    device = "cpu" if ranks is not None else c.device  # ranks: moved to their devices when wrapped
    single_full = state is not None and not sharded and not state.lora  # its weights: model/
    model = load_model(str(Path(location) / "model") if single_full else c.model, device)
    ref_model = None
    if c.loss.kl_beta > 0 and c.lora is None:  # LoRA: the reference is the base with adapters off
        ref_model = load_model(c.model, device).eval().requires_grad_(False)
    if c.lora is not None:
        model = add_lora(model, c.lora.rank)
        if state is not None and not sharded:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(model, load_file(str(Path(location) / "adapter" / "adapter_model.safetensors")))
    # Saved with every checkpoint: the checkpoint's own copy first; None when neither has one (test models).
    tokenizer = None
    if location is not None:
        with _local_copy(location, "model") as files:  # (a temporary copy is deleted once loaded)
            tokenizer = load_tokenizer(files, missing_ok=True)
    if tokenizer is None:
        tokenizer = load_tokenizer(c.model, missing_ok=True)
    pad_id = pad_id_of(model, tokenizer)
    if ranks is not None:
        model.train()
        model, runner, ref_model = parallelize(model, ranks, c.parallel, ref_model)
        trainer = Trainer(model, c, ref_model=ref_model, pad_id=pad_id, device=ranks.device, runner=runner,
                          ranks=ranks)
    else:
        trainer_class = TRAINERS.get(c.backend.kind)
        trainer = trainer_class(model, c, ref_model=ref_model, pad_id=pad_id, device=c.device)
    lineage, offsets = Lineage(), {}
    if state is not None:
        if sharded:
            sharded_ckpt.load_sharded(location, trainer)
        elif ranks is not None:
            sharded_ckpt.load_single_process_optimizer(location, trainer)
        else:
            ckpt.load_trainer_state(location, trainer.optimizer, trainer.scheduler)
        lineage = Lineage(state.step, state.policy_version, state.groups_consumed)
        lineage.recent.extend(sharded_ckpt.read_text(location, "recent_groups.txt").split())
        offsets = state.offsets
    return trainer, tokenizer, lineage, offsets


@contextlib.contextmanager
def _local_copy(location: str, name: str) -> Iterator[str]:
    """``location/name`` on this filesystem while the block runs (a checkpoint on object storage:
    its small files copied to a temporary directory, deleted after; for the tokenizer)."""
    if not sharded_ckpt.is_url(location):
        yield str(Path(location) / name)
        return
    import tempfile

    from rollstream.weight_files import filesystem

    fs, path = filesystem(location)
    with tempfile.TemporaryDirectory(prefix="rollstream-ckpt-") as local:
        for remote in fs.ls(f"{path}/{name}", detail=False):
            if not remote.endswith(".safetensors"):
                fs.get_file(remote, f"{local}/{remote.rsplit('/', 1)[-1]}")
        yield local
