"""What the learner does with its model besides loading it (rollstream/models.py loads it, for
every stage alike): the padding id, LoRA adapters, and the state dicts it broadcasts.
"""

from __future__ import annotations

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
