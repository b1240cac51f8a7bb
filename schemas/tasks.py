"""The JSON task spec: one task per line of a ``.jsonl`` file.

A task is what a prompt sampler issues and what the executor scores against::

    {"task_id": "strings/reverse_words",          # unique, stable
     "family": "strings",                         # mixture / metrics bucket
     "prompt": "Write a function reverse_words(s) ...",   # or "messages": [...]
     "reward": {"kind": "python_tests",           # schemas.events.RewardSpec
                "entry_point": "reverse_words",
                "tests": ["assert reverse_words('a b') == 'b a'"],
                "timeout_s": 5.0},
     "heldout_tests": ["assert reverse_words('') == ''"],   # for eval only
     "reference_solution": "def reverse_words(s): ...",    # optional, for checks
     "wrong_solutions": ["def reverse_words(s): return s"],  # optional: each must fail a test
     "difficulty": 1}

``prompt`` is shorthand for ``messages = [{"role": "user", "content": prompt}]``.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from rollstream.schemas.events import Id, Message, RewardSpec, SamplingParams, Text


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    task_id: Id
    family: Id = "default"
    prompt: Text | None = None
    messages: Annotated[list[Message], Meta(max_length=1024)] | None = None
    reward: RewardSpec = RewardSpec()
    heldout_tests: Annotated[list[Text], Meta(max_length=1000)] = []
    reference_solution: Text | None = None
    sampling: SamplingParams | None = None
    max_turns: Annotated[int, Meta(ge=1, le=64)] = 1
    difficulty: Annotated[int, Meta(ge=0, le=10)] = 1
    # Plausible but wrong solutions, each of which must fail at least one visible test (task
    # intake, `rollstream tasks check`; the scripted generator's answers). Added with a default, so
    # task files written before it still load (schemas/events.py's rule).
    wrong_solutions: Annotated[list[Text], Meta(max_length=100)] = []

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"task {self.task_id!r}: give exactly one of 'prompt' or 'messages'")

    def issued_reward(self) -> RewardSpec:
        """The reward spec this task's prompts carry: its own, with its reference solution for the
        executor's reference check (the model never sees the spec)."""
        if self.reference_solution and not self.reward.reference:
            return msgspec.structs.replace(self.reward, reference=self.reference_solution)
        return self.reward

    def chat(self) -> list[Message]:
        """The task as chat messages."""
        if self.messages is not None:
            return list(self.messages)
        return [Message(role="user", content=self.prompt or "")]


_task_decoder = msgspec.json.Decoder(TaskSpec)


def decode_task(line: bytes | str) -> TaskSpec:
    """Parse one JSONL line; raises ``msgspec.ValidationError`` naming the bad field."""
    return _task_decoder.decode(line)


def encode_task(task: TaskSpec) -> bytes:
    return msgspec.json.encode(task)
