"""What the generators (and eval) need of a loaded model and tokenizer, besides loading them.

Loading (resolving ``"smollm2"`` or a local directory, converting the GGUF, the converted-model
cache, the tokenizer's settings) is rollstream/models.py's, shared with the learner, so both
stages see the same model and tokenize the same text to the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rollstream.errors import BackendError


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
