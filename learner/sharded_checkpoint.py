"""Sharded checkpoints: ``torch.distributed.checkpoint`` (DCP) on a directory or any fsspec URL.

Written when the learner runs on several ranks, or when ``checkpoint.dir`` is a URL (object
storage); one rank with a local directory keeps the single-process format
(learner/checkpoint.py). Both resume on any rank count. Layout::

    step-00000012-g0000000048/
      shards/             DCP: every rank's shards of the model and optimizer state (.metadata +
                          __{rank}_0.distcp), loadable on any number of ranks (or none)
      model/              the Hugging Face export: config, model.safetensors (or model-0000i +
                          index), tokenizer; gathered one tensor at a time, LoRA merged
      trainer.pt          LR scheduler and rank 0's RNG states
      state.json          step, policy_version, groups_consumed, the ``advantages`` offsets (as before)
      recent_groups.txt   the duplicate filter
      COMMIT              written last: a checkpoint without it does not exist
    latest                the newest committed checkpoint's name (a hint; COMMIT decides)

Object stores have no atomic rename, so a checkpoint is written where it stays and counts only
once COMMIT is there; a directory without it (a crash mid-write) is overwritten by the next
save of that step, ignored by resume and pruned with the old ones.
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rollstream.errors import CheckpointError
from rollstream.learner import checkpoint as ckpt
from rollstream.weight_files import DirectoryWriter, filesystem, is_local

log = logging.getLogger(__name__)
SHARDS = "shards"
COMMIT = "COMMIT"
MODEL = "model"


def is_url(location: str | Path) -> bool:
    return "://" in str(location) and not str(location).startswith("file://")


def _url(fs: Any, path: str) -> str:
    """A path of ``fs`` as the location callers pass around (a plain path when local)."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def is_sharded(location: str | Path) -> bool:
    fs, path = filesystem(str(location))
    return fs.exists(f"{path}/{SHARDS}")


def committed(fs: Any, path: str) -> bool:
    """Sharded: COMMIT is there; single-process: it was renamed into place whole (state.json)."""
    if fs.exists(f"{path}/{SHARDS}") or fs.exists(f"{path}/{COMMIT}"):
        return fs.exists(f"{path}/{COMMIT}")
    return fs.exists(f"{path}/state.json")


def latest_checkpoint(root: str | Path) -> str | None:
    """The checkpoint to resume from, either format: the one ``latest`` names when it is
    committed, else the newest committed one; None when there is none."""
    fs, base = filesystem(str(root))
    pointer = f"{base}/{ckpt.LATEST}"
    if fs.exists(pointer):
        name = fs.cat_file(pointer).decode().strip()
        if committed(fs, f"{base}/{name}"):
            return _url(fs, f"{base}/{name}")
        if not fs.exists(f"{base}/{name}/{SHARDS}"):  # the single-process format's own rule
            raise CheckpointError(f"{pointer} points at {name}, which is not a complete checkpoint")
        log.warning("%s names %s, which has no commit marker; taking the newest committed one", pointer, name)
    for path in reversed(_step_dirs(fs, base)):
        if committed(fs, path):
            return _url(fs, path)
    return None


def _step_dirs(fs: Any, base: str) -> list[str]:
    try:
        listed = fs.ls(base, detail=False)
    except FileNotFoundError:
        return []
    return sorted(p.rstrip("/") for p in listed if p.rstrip("/").rsplit("/", 1)[-1].startswith("step-"))


def load_state(location: str) -> ckpt.CheckpointState:
    fs, path = filesystem(location)
    try:
        return ckpt.CheckpointState.from_json(fs.cat_file(f"{path}/state.json").decode())
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot read checkpoint state in {location}: {exc}") from exc


def read_text(location: str, name: str) -> str:
    fs, path = filesystem(location)
    return fs.cat_file(f"{path}/{name}").decode() if fs.exists(f"{path}/{name}") else ""


# --- writing -------------------------------------------------------------------------------------


def _writer(location: str) -> Any:
    import torch.distributed.checkpoint as dcp

    if is_url(location):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(location)
    return dcp.FileSystemWriter(location)


def _reader(location: str) -> Any:
    import torch.distributed.checkpoint as dcp

    if is_url(location):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(location)
    return dcp.FileSystemReader(location)


def _has_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    return any(optimizer.state.values())


def save_shards(location: str, trainer: Any, ranks: Any) -> None:
    """Every rank: its shards of model and optimizer to ``location/shards`` (a collective with
    several ranks). An optimizer that never stepped is left out (taking its state dict would
    create it, and a resumed AdamW would count a step that never happened)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if _has_optimizer_state(trainer.optimizer):
        model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
        state = {"model": model_state, "optim": optim_state}
    else:
        state = {"model": get_model_state_dict(trainer.model)}
    dcp.save(state, storage_writer=_writer(f"{location}/{SHARDS}"))


def save_checkpoint(root: str, state: ckpt.CheckpointState, trainer: Any, *, tokenizer: Any, keep: int,
                    shard_bytes: int, extra_files: dict[str, str] | None = None) -> str:
    """Rank 0 (``trainer``: the :class:`Leader` with several ranks, which brings the others
    along): write a sharded checkpoint of ``state`` under ``root``, COMMIT last, then ``latest``;
    keep the newest ``keep``. Returns its location."""
    fs, base = filesystem(root)
    path = f"{base}/{ckpt.step_dir_name(state.step, state.groups_consumed)}"
    if fs.exists(path):  # left by a lineage that died after this step, uncommitted or not `latest`
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    location = _url(fs, path)
    trainer.save_sharded(location)
    export_model(fs, f"{path}/{MODEL}", trainer, tokenizer, shard_bytes)
    buffer = io.BytesIO()
    torch.save({"scheduler": trainer.scheduler.state_dict(), "rng": ckpt.rng_state()}, buffer)
    fs.pipe_file(f"{path}/trainer.pt", buffer.getvalue())
    for name, text in (extra_files or {}).items():
        fs.pipe_file(f"{path}/{name}", text.encode())
    fs.pipe_file(f"{path}/state.json", state.to_json().encode())
    world = getattr(getattr(trainer, "ranks", None), "world", 1)
    fs.pipe_file(f"{path}/{COMMIT}", json.dumps({"committed_at": time.time(), "ranks": world}).encode())
    fs.pipe_file(f"{base}/{ckpt.LATEST}", (path.rsplit("/", 1)[-1] + "\n").encode())
    _prune(fs, base, keep, path)
    return location


def export_model(fs: Any, path: str, trainer: Any, tokenizer: Any, shard_bytes: int) -> None:
    """The Hugging Face directory of the trained model (LoRA merged), gathered one tensor at a
    time (every rank takes part; rank 0 writes files of at most ``shard_bytes``)."""
    base = getattr(trainer.model, "get_base_model", lambda: trainer.model)()
    config = base.config
    if not getattr(config, "architectures", None):
        config.architectures = [next(c.__name__ for c in type(base).__mro__ if not c.__name__.startswith("FSDP"))]
    writer = DirectoryWriter(fs, path, shard_bytes)
    for name, tensor in trainer.named_weights(None):
        writer.add(name, tensor)
    with tempfile.TemporaryDirectory(prefix="rollstream-export-") as tmp:
        config.save_pretrained(tmp)
        generation = getattr(base, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    writer.close(files)


def _prune(fs: Any, base: str, keep: int, current: str) -> None:
    dirs = _step_dirs(fs, base)
    for old in dirs[:-keep] if keep > 0 else []:
        if old != current:
            fs.rm(old, recursive=True)


# --- resuming ------------------------------------------------------------------------------------


def load_sharded(location: str, trainer: Any) -> None:
    """Every rank (or one process without torch.distributed): model and optimizer from the
    shards, resharded to this run's ranks; scheduler and RNG from trainer.pt."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    reader = _reader(f"{location}/{SHARDS}")
    saved = reader.read_metadata().state_dict_metadata
    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    state: dict[str, Any] = {"model": model_state}
    with_optimizer = any(key.startswith("optim") for key in saved)
    if with_optimizer:
        state["optim"] = optim_state
    dcp.load(state, storage_reader=_reader(f"{location}/{SHARDS}"))
    if with_optimizer:
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    else:  # never stepped when saved: a fresh optimizer, as then
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(trainer.model, state["model"])
        trainer.optimizer.state.clear()
    _load_schedule(location, trainer)


def _load_schedule(location: str, trainer: Any) -> None:
    fs, path = filesystem(location)
    saved = torch.load(io.BytesIO(fs.cat_file(f"{path}/trainer.pt")), map_location="cpu", weights_only=False)
    trainer.scheduler.load_state_dict(saved["scheduler"])
    ckpt.set_rng_state(saved["rng"])


def load_single_process_optimizer(location: str, trainer: Any) -> None:
    """A single-process checkpoint's optimizer (trainer.pt: state by parameter index) into a
    sharded or replicated trainer: the indices become parameter names (the trainable
    parameters in order, as the single process built its optimizer), then every rank takes its
    part of the full state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    saved = torch.load(Path(location) / "trainer.pt", map_location="cpu", weights_only=False)
    names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    optimizer = saved["optimizer"]
    full = {"state": {names[i]: value for i, value in optimizer["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in optimizer["param_groups"]]}
    if full["state"]:
        set_optimizer_state_dict(trainer.model, trainer.optimizer, full,
                                 options=StateDictOptions(full_state_dict=True))
    trainer.scheduler.load_state_dict(saved["scheduler"])
    ckpt.set_rng_state(saved["rng"])
