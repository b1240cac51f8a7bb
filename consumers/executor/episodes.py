"""Multi-turn episodes: what the executor decides after a turn (the generator's side, how it continues
an episode, is ``consumers/generator/turns.py``).

An episode is one sample of a group (``rollout_id`` = ``group_id/sample_index``) given up to
``max_turns`` turns. After each turn the executor either **ends** it (the code passed, the turns
are used up, or nothing could be generated) and emits one ``RewardScored`` for the whole
trajectory, or **continues** it: it sends a ``PromptIssued`` with a :class:`Continuation` for
that one sample back to ``prompts``, carrying the transcript so far as tokens (with the mask of
model-generated tokens and their behaviour log-probs, and every policy version used) and a
concise observation of what went wrong (which tests failed and why, the compiler error, the
stderr tail; at most ``OBSERVATION_CHARS``).

The generator renders the observation as the next user turn in the model's chat template and
appends its tokens to the transcript (mask 0: the environment's, not the model's), then samples
the next turn. The rollout it emits spans every turn: ``completion_token_ids`` is turn 1, the
observation, turn 2, ...; ``generated_mask`` marks the model's tokens, which are the only ones
the learner trains on; ``policy_version_first`` is the oldest version that produced any of its
tokens, so staleness is measured from it. ``completion_text`` is the new turn's text only: it is
what the executor runs.

Reward: the final turn's reward (final success, with partial credit per test as the spec's
weights say), minus ``RewardSpec.turn_penalty`` for every turn after the first.

**Subtask chains** (``RewardSpec.subtasks``): the episode works through the steps in order, each
for as many turns as it takes (within ``max_turns``). A turn is tested against its step's tests;
the code of the steps already passed (``carried_code``) runs before the turn's own code, so a
module is built function by function, and a step can use what earlier steps defined. It stays
with the episode (carried in the continuation), never another's. When a step passes, the
observation gives the next step's instruction; when the last passes, or the turns run out, the
episode ends with reward ``progress`` = (steps passed + the failing step's fraction of tests
passed) / steps, less the per-turn penalty.

State between turns: the code passed is carried; files a turn wrote in the sandbox are not.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from rollstream.consumers.executor.rewards import extract_code
from rollstream.schemas.events import (
    ActionGenerated,
    Continuation,
    ExecutionRecord,
    Message,
    PromptIssued,
    RewardScored,
    RewardSpec,
    WorkspaceFile,
)

OBSERVATION_CHARS = 2000  # an observation's size cap
FAILED_TESTS_SHOWN = 5
TAIL_CHARS = 600


def ends(action: ActionGenerated, execution: ExecutionRecord) -> bool:
    """Whether the episode ends after this turn (else it continues)."""
    if action.turn >= action.max_turns or action.error is not None or execution.error_kind in ("tamper", "infra"):
        return True
    if execution.passed:  # a chain goes on to its next step
        return action.subtask_index + 1 >= len(action.reward.subtasks)
    return False


def chain_code(action: ActionGenerated) -> str | None:
    """A chain turn's code to run: the code carried from the steps passed, then this turn's (None:
    the turn has no code)."""
    new = extract_code(action.completion_text).code
    if new is None or not action.carried_code.strip():
        return new
    return f"{action.carried_code.rstrip()}\n\n\n{new}"


def subtask_turn(action: ActionGenerated) -> tuple[RewardSpec, str] | None:
    """For a turn of a subtask chain: its step's spec (the step's tests) and the completion to run
    (:func:`chain_code`); None for a plain task."""
    spec = action.reward
    if not spec.subtasks:
        return None
    index = min(action.subtask_index, len(spec.subtasks) - 1)
    step = spec.subtasks[index]
    step_spec = msgspec.structs.replace(spec, tests=list(step.tests), subtasks=[], entry_point="",
                                        reference=step_reference(spec, index))
    code = chain_code(action)
    if code is None:  # nothing to run: scored as such
        return step_spec, action.completion_text
    return step_spec, f"```python\n{code}\n```"


def step_reference(spec: RewardSpec, index: int) -> str:
    """The reference a chain step is checked against: the references of the steps up to it, in order
    (what a correct episode has carried), else the task's whole reference. It tells the judge how the
    step's tests read their names (a helper called ``chunk`` is the task's, not the module)."""
    steps = [s.reference for s in spec.subtasks[: index + 1]]
    if all(steps):
        return "\n\n\n".join(r.rstrip() for r in steps if r is not None) + "\n"
    return spec.reference


def progress(action: ActionGenerated, execution: ExecutionRecord) -> float:
    """A chain's progress after this turn: steps passed, plus the failing step's share of tests."""
    steps = len(action.reward.subtasks)
    if execution.passed:
        return (action.subtask_index + 1) / steps
    partial = execution.tests_passed / execution.tests_total if execution.tests_total else 0.0
    return (action.subtask_index + partial) / steps


def after_turn(action: ActionGenerated, scored: RewardScored, events: Sequence[dict[str, Any]] = (),
               *, now: float | None = None, workspace: Sequence[tuple[str, bytes]] = ()) -> tuple[str, Any]:
    """What the executor sends after scoring a turn: ``("rewards", the episode's RewardScored)`` when
    the episode ends, else ``("prompts", the continuation for its next turn)``, which carries the
    files the turn left (``workspace``: its sandbox's /work after it ran, size-capped)."""
    files = [WorkspaceFile(path=path, data=data) for path, data in workspace]
    execution = scored.execution
    chain = bool(action.reward.subtasks)
    if ends(action, execution):
        if chain:
            done = progress(action, execution)
            reward = final_reward(action.reward, done, action.turn)
            scored = msgspec.structs.replace(scored, reward=reward, components={"progress": done})
        elif action.turn > 1:
            scored = msgspec.structs.replace(scored, reward=final_reward(action.reward, scored.reward, action.turn))
        return "rewards", scored
    if chain and execution.passed:  # on to the next step, with this turn's code carried
        step = action.subtask_index + 1
        told = (f"Step {step} passed. Step {step + 1} of {len(action.reward.subtasks)}: "
                f"{action.reward.subtasks[step].instruction}\nAnswer with the code of this step in one ```python "
                f"block; what you wrote before is kept.")
        return "prompts", continuation_of(action, told[:OBSERVATION_CHARS], now=now, subtask_index=step,
                                          carried_code=chain_code(action) or action.carried_code, workspace=files)
    spec = subtask_turn(action)[0] if chain else action.reward
    return "prompts", continuation_of(action, observation(spec, execution, events, chain=chain), now=now,
                                      subtask_index=action.subtask_index, carried_code=action.carried_code,
                                      workspace=files)


def final_reward(spec: RewardSpec, reward: float, turn: int) -> float:
    """The episode's reward: the last turn's, less the per-turn penalty for every turn after the first."""
    return reward - spec.turn_penalty * (turn - 1)


def observation(spec: RewardSpec, execution: ExecutionRecord, events: Sequence[dict[str, Any]] = (), *,
                chain: bool = False) -> str:
    """What the model is told after a failed turn: the verdict, the failing tests and why, the
    error, the stderr tail; at most ``OBSERVATION_CHARS``."""
    lines = []
    verdict = execution.verdict
    if verdict == "syntax":
        where = f" (line {execution.error_line})" if execution.error_line else ""
        lines.append(f"Your code does not compile{where}: {execution.error_message}")
    elif verdict == "timeout":
        lines.append(f"Your code ran out of time ({spec.timeout_s:g} s).")
    elif verdict == "oom":
        lines.append("Your code ran out of memory.")
    elif verdict == "output_limit":
        lines.append("Your code wrote too much output.")
    elif verdict == "no_code":
        lines.append("Your answer has no code: put the code in a ```python block.")
    elif verdict == "fail":
        lines.append(f"{execution.tests_passed} of {execution.tests_total} tests passed.")
    else:
        lines.append(f"Your code failed ({verdict}): {execution.error_message}".rstrip(": "))
    failed = [e for e in events if e.get("e") == "test" and not e.get("ok")]
    for event in failed[:FAILED_TESTS_SHOWN]:
        index = event.get("i")
        test = spec.tests[index] if isinstance(index, int) and 0 <= index < len(spec.tests) else "?"
        why = f"{event.get('type', '')}: {event.get('msg', '')}".strip(": ")
        lines.append(f"Failed: {test.strip()[:300]}" + (f" ({why[:300]})" if why else ""))
    if len(failed) > FAILED_TESTS_SHOWN:
        lines.append(f"... and {len(failed) - FAILED_TESTS_SHOWN} more failing tests.")
    if verdict not in ("fail", "syntax") and execution.stderr_tail.strip():
        lines.append("stderr:\n" + execution.stderr_tail.strip()[-TAIL_CHARS:])
    lines.append("Fix it and answer with this step's corrected code in one ```python block; what the steps "
                 "passed defined is kept." if chain else
                 "Fix it and answer with the whole corrected code in one ```python block.")
    text = "\n".join(lines)
    return text if len(text) <= OBSERVATION_CHARS else text[: OBSERVATION_CHARS - 4] + " ..."


def continuation_of(action: ActionGenerated, observed: str, *, now: float | None = None, subtask_index: int = 0,
                    carried_code: str = "", workspace: Sequence[WorkspaceFile] = ()) -> PromptIssued:
    """The ``PromptIssued`` asking for the next turn of ``action``'s sample."""
    rollout = action.rollout
    mask = list(rollout.generated_mask) if rollout.generated_mask is not None else [1] * len(
        rollout.completion_token_ids)
    versions = sorted({*action.policy_versions, rollout.policy_version_first, rollout.policy_version_last})[-1024:]
    return PromptIssued(
        group_id=rollout.group_id, task_id=rollout.task_id, family=rollout.family,
        messages=[Message(role="user", content=observed)], group_size=rollout.group_size, reward=action.reward,
        max_turns=action.max_turns, issued_policy_version=rollout.issued_policy_version,
        issued_at=time.time() if now is None else now,
        continuation=Continuation(
            sample_index=rollout.sample_index, turn=action.turn + 1,
            messages=[Message(role="assistant", content=action.completion_text), Message(role="user", content=observed)],
            prompt_token_ids=list(rollout.prompt_token_ids), completion_token_ids=list(rollout.completion_token_ids),
            generated_mask=mask, behaviour_logprobs=list(rollout.behaviour_logprobs), observation=observed,
            policy_versions=versions, subtask_index=subtask_index, carried_code=carried_code,
            workspace=list(workspace)))
