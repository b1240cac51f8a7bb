"""Learner checkpoints: written atomically, found through a ``latest`` pointer.

Layout under ``checkpoint_dir``::

    step-00000012-g0000000048/   (step, groups consumed)
      model/        Hugging Face directory (config, safetensors, tokenizer): loadable by
                    transformers and SGLang. With LoRA: the merged full model.
      adapter/      LoRA only: the peft adapter (what resume loads, exactly).
      trainer.pt    optimizer, LR scheduler and RNG states (torch.save; our own file)
      state.json    step, policy_version, groups_consumed, the ``advantages`` input offsets
                    (partition -> next offset to read) and when it was written
    latest          text: the name of the newest complete checkpoint
    steps.jsonl     one line per optimizer step (run id, step, group ids): the audit trail
                    used to show that every group is trained exactly once per lineage

A checkpoint is built in ``.tmp-*`` and renamed into place (a rename is atomic), then the
pointer is replaced the same way, so a crash at any moment leaves the previous one usable.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollstream.durable import fsync_dir
from rollstream.errors import CheckpointError

LATEST = "latest"
STEP_LOG = "steps.jsonl"


@dataclass(frozen=True)
class CheckpointState:
    step: int
    policy_version: int
    groups_consumed: int
    offsets: dict[int, int] = field(default_factory=dict)  # partition of `advantages` -> next offset
    topic: str = ""
    lora: bool = False
    written_at: float = 0.0

    def to_json(self) -> str:
        data = asdict(self)
        data["offsets"] = {str(p): o for p, o in sorted(self.offsets.items())}
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> CheckpointState:
        data = json.loads(text)
        data["offsets"] = {int(p): int(o) for p, o in data.get("offsets", {}).items()}
        return cls(**data)


def step_dir_name(step: int, groups_consumed: int) -> str:
    # Groups in the name too: groups consumed while every rollout was stale advance no step.
    return f"step-{step:08d}-g{groups_consumed:010d}"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | Path,
    state: CheckpointState,
    *,
    model: torch.nn.Module,
    tokenizer: Any | None,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    merged_weights: dict[str, torch.Tensor] | None = None,
    keep: int = 2,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write a checkpoint of ``state`` atomically and point ``latest`` at it; keep the newest ``keep``.

    ``merged_weights`` (LoRA): the merged full weights to save as ``model/``; the adapter itself
    goes to ``adapter/``. ``extra_files``: small text files to add (name -> content).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(state.step, state.groups_consumed)
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        if state.lora:
            model.save_pretrained(tmp / "adapter")
            base = model.get_base_model()  # type: ignore[operator]
            base.save_pretrained(tmp / "model", state_dict=merged_weights)
        else:
            model.save_pretrained(tmp / "model")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
            tmp / "trainer.pt",
        )
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        (tmp / "state.json").write_text(state.to_json())
        _fsync_tree(tmp)
        if final.exists():  # left by a lineage that died after this step; it is not `latest`
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _write_pointer(root, final.name)
    _prune(root, keep)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint ``latest`` points at, or None when there is none."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    path = Path(root) / pointer.read_text().strip()
    if not (path / "state.json").exists():
        raise CheckpointError(f"{pointer} points at {path}, which is not a complete checkpoint")
    return path


def load_state(path: str | Path) -> CheckpointState:
    try:
        return CheckpointState.from_json((Path(path) / "state.json").read_text())
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot read checkpoint state in {path}: {exc}") from exc


def load_trainer_state(path: str | Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """Restore optimizer, scheduler and RNG states (model weights are loaded by the caller)."""
    try:
        saved = torch.load(Path(path) / "trainer.pt", map_location="cpu", weights_only=False)
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"cannot read trainer state in {path}: {exc}") from exc
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    set_rng_state(saved["rng"])


def append_step_log(root: str | Path, record: dict[str, Any]) -> None:
    """One JSON line per optimizer step (append; a killed process loses at most its last line)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / STEP_LOG, "a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_step_log(root: str | Path) -> list[dict[str, Any]]:
    path = Path(root) / STEP_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_pointer(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    current = (root / LATEST).read_text().strip()
    for old in steps[:-keep] if keep > 0 else []:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(path)
