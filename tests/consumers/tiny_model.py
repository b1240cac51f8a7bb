"""A tiny random Llama (2 layers, hidden 64) with a tiny byte-level BPE tokenizer (~320 tokens)
and a ChatML template (the SmolLM2 format), saved as an ordinary local model directory.
Used by the generator's tests and by ``bench/generator.py``."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "Write a Python function that reverses a string.",
    "```python\nprint('hello world')\n```\n",
    "The quick brown fox jumps over the lazy dog. 0123456789",
] * 20


def make_tiny_model_dir(path: Path, *, max_positions: int = 256, seed: int = 0) -> Path:
    """Build and save the tiny model + tokenizer under ``path``; returns ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token="<|im_start|>")
    tokenizer.chat_template = CHATML
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True,
                         initializer_range=0.2)  # sharper logits than the default, so samples vary in length
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
