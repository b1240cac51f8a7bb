"""What the learner does with its model besides loading it (rollstream/models.py loads it, for
every stage alike): the padding id, LoRA adapters, and the state dicts it broadcasts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def pad_id_of(model: torch.nn.Module, tokenizer: Any | None) -> int:
    """Any id works as padding (padded positions are masked); prefer the model's own."""
    for source in (tokenizer, getattr(model, "config", None)):
        value = getattr(source, "pad_token_id", None) if source is not None else None
        if isinstance(value, int):
            return value
    return 0


def add_lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters on every linear layer of the blocks (peft)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", bias="none")
    return get_peft_model(model, config)


def merged_state_dict(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full weights under the plain model's parameter names; LoRA deltas merged in, the model untouched.

    Computed as ``W + delta`` per adapted layer instead of merge/unmerge, which would add
    rounding drift to the trained weights at every broadcast.
    """
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    with torch.no_grad():
        if not isinstance(model, PeftModel):
            return {k: _cast(v, dtype) for k, v in _untied(model.state_dict()).items()}
        base = model.get_base_model()
        out: dict[str, torch.Tensor] = {}
        deltas = {}
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                deltas[f"{name}.weight"] = delta
        for name, tensor in _untied(base.state_dict()).items():
            if "lora_" in name:
                continue
            plain = name.replace(".base_layer.", ".")
            value = tensor + deltas[plain] if plain in deltas else tensor
            out[plain] = _cast(value, dtype)
        return out


def _untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop entries that share storage with an earlier one (tied embeddings): loading the first
    into a model with tied weights sets both, and the broadcast stays one copy smaller."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = {}
    for name, tensor in state.items():
        ident = (tensor.data_ptr(), tuple(tensor.shape))
        if ident in seen:
            continue
        seen.add(ident)
        out[name] = tensor
    return out


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    tensor = tensor.detach()
    # Always a copy: the broadcast runs while the next step may already update the weights.
    return tensor.to(dtype=dtype, copy=True) if dtype is not None else tensor.clone()


def iter_merged_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`merged_state_dict`, one tensor at a time: what a publish streams, so that no more
    than a tensor (and a LoRA layer's adapters) is held besides the model. Sharded parameters
    (FSDP's DTensors) are gathered here, one at a time: with several ranks every rank must
    iterate (the gathers are collectives) and every rank gets the full tensors."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    with torch.no_grad():
        if not isinstance(model, PeftModel):
            for name, tensor in _untied_vars(model):
                yield name, _cast(_full(tensor), dtype)
            return
        base = model.get_base_model()
        layers = {f"{name}.weight": module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
        for name, tensor in _untied_vars(base):
            if "lora_" in name:
                continue
            plain = name.replace(".base_layer.", ".")
            value = _full(tensor)
            module = layers.get(plain)
            if module is not None:
                value = value + _lora_delta(module)
            yield plain, _cast(value, dtype)


def _lora_delta(module: Any) -> torch.Tensor:
    """``get_delta_weight`` summed over the active adapters, from gathered adapter weights."""
    total = None
    for adapter in module.active_adapters:
        if adapter not in module.lora_A:
            continue
        delta = _full(module.lora_B[adapter].weight) @ _full(module.lora_A[adapter].weight)
        if module.fan_in_fan_out:
            delta = delta.T
        delta = delta * module.scaling[adapter]
        total = delta if total is None else total + delta
    return total


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded one (a collective), or the tensor itself."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor


def _untied_vars(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """State-dict entries, each parameter once (tied embeddings: the first name), by identity:
    the same list on every rank, whatever each holds of it."""
    seen: set[int] = set()
    out = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out.append((name, tensor))
    return out
