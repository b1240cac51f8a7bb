"""A 3-turn episode with SmolLM2's real tokenizer stays token-exact: the learner's token ids are the
model's generated tokens and the observation tokens concatenated, the model's own output is never
re-tokenised (a turn sampled as a non-canonical split of its text keeps that split), and the mask
covers the model's tokens only."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from rollstream.config import GeneratorConfig
from rollstream.consumers.executor.episodes import continuation_of
from rollstream.consumers.generator.backends.base import Completion
from rollstream.consumers.generator.chat import chat_prompt_ids
from rollstream.consumers.generator.stage import action_from, group_requests
from rollstream.consumers.generator.turns import continued, invalid_continuation, observation_ids
from rollstream.models import load_tokenizer
from rollstream.schemas import PromptIssued, codec
from rollstream.testing import make_prompt

pytestmark = pytest.mark.integration


def _char_tokens(tokenizer: Any, text: str) -> list[int]:
    """``text`` as one token per character: a split the model may sample, never the one encode gives."""
    return [tid for ch in text for tid in tokenizer.encode(ch, add_special_tokens=False)]


def _completion(tokens: list[int], tokenizer: Any, version: int) -> Completion:
    return Completion(request_id="g/1", token_ids=tokens, logprobs=[-0.5 - i / 1000 for i in range(len(tokens))],
                      text=tokenizer.decode(tokens, skip_special_tokens=True), finish_reason="stop",
                      logprob_temperature=1.0, policy_version_first=version, policy_version_last=version)


def test_three_turns_concatenate_generated_and_observation_tokens_without_retokenising() -> None:
    tokenizer = load_tokenizer("smollm2")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [_char_tokens(tokenizer, "```python\ndef f(x):\n    return x\n```") + [end],
             _char_tokens(tokenizer, "```python\ndef f(x):\n    return x + 1\n```") + [end],
             tokenizer.encode("```python\ndef f(x):\n    return 2 * x\n```", add_special_tokens=False)]  # no end: cut
    assert tokenizer.encode(tokenizer.decode(turns[0]), add_special_tokens=False) != turns[0]  # re-encoding differs
    first = make_prompt(group_id="g", group_size=2)
    prompt_ids = chat_prompt_ids(tokenizer, [{"role": m.role, "content": m.content} for m in first.messages])
    action = action_from(first, 1, prompt_ids, _completion(turns[0], tokenizer, 3), generator_id="t", queued_s=0,
                         generate_s=0)
    action = msgspec.structs.replace(action, max_turns=3)
    assert all(r.more_turns for r in group_requests(msgspec.structs.replace(first, max_turns=3), prompt_ids,
                                                     GeneratorConfig(), 0))
    assert not any(r.more_turns for r in group_requests(first, prompt_ids, GeneratorConfig(), 0))  # one turn
    observations, observed_ids = ["1 of 3 tests passed: f(1) should be 2.", "2 of 3 tests passed."], []
    for turn, text in ((2, observations[0]), (3, observations[1])):
        event = continuation_of(action, text, now=0.0)
        event = codec(PromptIssued).decode(codec(PromptIssued).encode(event))  # as it travels
        assert invalid_continuation(event, tokenizer) is None and event.continuation.turn == turn
        observed = observation_ids(tokenizer, text, event.continuation.completion_token_ids)
        observed_ids.append(observed)
        context = continued(event, observed)  # what the model is sampled from for this turn
        [request] = group_requests(event, context, GeneratorConfig(), 0)
        assert (request.turn, request.more_turns) == (turn, turn < 3)  # the last turn's cache is not kept
        completion = _completion(turns[turn - 1], tokenizer, 3 + turn)
        action = action_from(event, 1, context, completion, generator_id="t", queued_s=0, generate_s=0,
                             observation_tokens=observed)
        assert list(context) == (list(prompt_ids) + list(action.rollout.completion_token_ids)[
            : len(context) - len(prompt_ids)])
    rollout = action.rollout
    o1, o2 = observed_ids
    assert list(rollout.prompt_token_ids) == prompt_ids
    assert list(rollout.completion_token_ids) == turns[0] + o1 + turns[1] + o2 + turns[2]
    assert list(rollout.generated_mask) == ([1] * len(turns[0]) + [0] * len(o1) + [1] * len(turns[1])
                                            + [0] * len(o2) + [1] * len(turns[2]))
    logprobs = list(rollout.behaviour_logprobs)
    assert [lp for lp, m in zip(logprobs, rollout.generated_mask, strict=True) if not m] == [0.0] * (len(o1) + len(o2))
    assert all(lp < 0 for lp, m in zip(logprobs, rollout.generated_mask, strict=True) if m)
    assert (rollout.policy_version_first, rollout.policy_version_last) == (3, 6)
    # the observation tokens close the model's turn, carry the observation as a user turn and open
    # the next assistant turn, as the chat template renders the conversation
    text = tokenizer.decode(o1)
    assert observations[0] in text and "user" in text and text.rstrip().endswith("assistant")
    whole = tokenizer.decode(list(rollout.prompt_token_ids) + list(rollout.completion_token_ids))
    assert whole.count("<|im_start|>assistant") == 3 and whole.count(observations[1]) == 1
