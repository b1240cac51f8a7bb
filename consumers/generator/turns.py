"""Multi-turn episodes, the generator's side: how a ``PromptIssued`` with a continuation becomes the
next turn of one sample (consumers/executor/episodes.py says what an episode is and what the executor
decides after each turn).

The observation is rendered as the next user turn in the model's chat template and appended to
the transcript (mask 0: the environment's tokens, not the model's); the rollout emitted spans
every turn, with the mask of the model's tokens and every policy version used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollstream.schemas.events import PromptIssued, Rollout
from rollstream.tasks import domain_of


def observation_ids(tokenizer: Any, observed: str, transcript: Sequence[int] = ()) -> list[int]:
    """The tokens between the model's last turn and its next one: the end of its turn (what the
    chat template puts after an assistant message, less the end-of-turn token the model generated
    itself, the last of ``transcript``), the observation as a user turn, and the header of the
    next assistant turn."""
    last_token = tokenizer.decode(list(transcript[-1:])) if len(transcript) else ""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return list(tokenizer.encode(f"\n{observed}\n", add_special_tokens=False))
    mark = "\u2063rollstream-turn\u2063"  # text no template produces: where the assistant content ends
    before = [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}]
    after = before + [{"role": "user", "content": observed}]
    head = tokenizer.apply_chat_template(before, tokenize=False)
    full = tokenizer.apply_chat_template(after, tokenize=False, add_generation_prompt=True)
    end_of_turn = head[head.index(mark) + len(mark):]
    text = end_of_turn + full[len(head):] if full.startswith(head) else end_of_turn + "\n" + observed + "\n"
    if last_token.strip() and text.startswith(last_token):
        text = text[len(last_token):]
    return list(tokenizer.encode(text, add_special_tokens=False))


def invalid_continuation(event: PromptIssued, tokenizer: Any) -> str | None:
    """Why a continuation cannot be served (None: it can)."""
    c = event.continuation
    assert c is not None
    n = len(c.completion_token_ids)
    vocab = len(tokenizer)
    if c.sample_index >= event.group_size:
        return f"invalid: continuation of sample {c.sample_index} of a group of {event.group_size}"
    if c.turn < 2 or c.turn > event.max_turns:
        return f"invalid: continuation turn {c.turn} outside 2..max_turns ({event.max_turns})"
    if len(c.generated_mask) != n or len(c.behaviour_logprobs) != n:
        return (f"invalid: continuation transcript of {n} tokens with {len(c.generated_mask)} mask entries and "
                f"{len(c.behaviour_logprobs)} log-probs")
    ids = list(c.prompt_token_ids) + list(c.completion_token_ids)
    if ids and (min(ids) < 0 or max(ids) >= vocab):
        return f"invalid: continuation token ids outside the vocabulary (0..{vocab - 1})"
    return None


def continued(event: PromptIssued, observation_tokens: list[int]) -> list[int]:
    """The context the next turn is sampled from: prompt, transcript so far, observation."""
    c = event.continuation
    assert c is not None
    return list(c.prompt_token_ids) + list(c.completion_token_ids) + observation_tokens


def continued_rollout(event: PromptIssued, observation_tokens: list[int], token_ids: list[int],
                      logprobs: list[float], *, version_first: int, version_last: int, finish_reason: str,
                      logprob_temperature: float) -> Rollout:
    """The rollout of the whole episode so far, the new turn included."""
    c = event.continuation
    assert c is not None
    previous = list(c.policy_versions) or [version_first]
    return Rollout(
        rollout_id=f"{event.group_id}/{c.sample_index}", group_id=event.group_id, sample_index=c.sample_index,
        group_size=event.group_size, task_id=event.task_id, family=event.family,
        domain=domain_of(event.reward.kind), prompt_token_ids=list(c.prompt_token_ids),
        completion_token_ids=list(c.completion_token_ids) + observation_tokens + token_ids,
        behaviour_logprobs=list(c.behaviour_logprobs) + [0.0] * len(observation_tokens) + logprobs,
        generated_mask=list(c.generated_mask) + [0] * len(observation_tokens) + [1] * len(token_ids),
        logprob_temperature=logprob_temperature,
        policy_version_first=min(min(previous), version_first), policy_version_last=version_last,
        issued_policy_version=event.issued_policy_version, finish_reason=finish_reason)
