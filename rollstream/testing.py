"""Small valid events and a tiny model, for tests and benchmarks (no stage uses this module).

Every field of each event is set explicitly, so that a schema change shows up here. The tiny
model is a random 2-layer Llama (hidden 64) with a ~320-token byte-level BPE tokenizer and the
SmolLM2 chat format, saved as an ordinary local model directory: it loads in a second and
produces real token ids and log-probs, so the whole pipeline can run on it.
"""

from __future__ import annotations

import time
from pathlib import Path

from rollstream.schemas import (
    ActionGenerated,
    ExecutionRecord,
    Message,
    PromptIssued,
    RewardScored,
    RewardSpec,
    Rollout,
)


def make_prompt(group_id: str = "g0", group_size: int = 4, task_id: str = "t/0") -> PromptIssued:
    return PromptIssued(
        group_id=group_id,
        task_id=task_id,
        family="t",
        messages=[Message(role="user", content="Write add(a, b).")],
        group_size=group_size,
        reward=RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3"]),
        issued_policy_version=0,
        issued_at=time.time(),
    )


def make_rollout(group_id: str = "g0", sample_index: int = 0, n_tokens: int = 4, version: int = 0, *,
                 group_size: int = 4, task_id: str = "t/0", family: str = "t") -> Rollout:
    return Rollout(
        rollout_id=f"{group_id}/{sample_index}",
        group_id=group_id,
        sample_index=sample_index,
        group_size=group_size,
        task_id=task_id,
        family=family,
        domain="code",  # make_prompt's task: python_tests
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=list(range(10, 10 + n_tokens)),
        behaviour_logprobs=[-0.5] * n_tokens,
        policy_version_first=version,
        policy_version_last=version,
        issued_policy_version=version,
        finish_reason="stop",
    )


def make_action(group_id: str = "g0", sample_index: int = 0) -> ActionGenerated:
    return ActionGenerated(
        rollout=make_rollout(group_id, sample_index),
        completion_text="```python\ndef add(a, b):\n    return a + b\n```",
        reward=RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3"]),
        generator_id="gen-0",
        queued_s=0.01,
        generate_s=0.5,
        generated_at=time.time(),
    )


def make_reward(group_id: str = "g0", sample_index: int = 0, reward: float = 1.0, *, group_size: int = 4,
                task_id: str = "t/0", family: str = "t", completion_tokens: int = 4) -> RewardScored:
    return RewardScored(
        rollout=make_rollout(group_id, sample_index, completion_tokens, group_size=group_size, task_id=task_id,
                             family=family),
        reward=reward,
        components={"tests": reward},
        execution=ExecutionRecord(sandbox_id="sb-0", exit_code=0, duration_s=0.01, error_kind="none",
                                  tests_passed=1, tests_total=1),
        executor_id="exec-0",
        scored_at=time.time(),
    )


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
