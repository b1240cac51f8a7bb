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

An episode that the learner can no longer train (its oldest weights already more than
``rl.max_staleness`` versions behind the learner's: ``stale_lag``) ends after the turn being
scored, instead of generating turns that would be thrown away.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rollstream.consumers.executor.rewards import extract_code, per_test_results, tests_total
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
from rollstream.weights import versions_past

OBSERVATION_CHARS = 2000  # an observation's size cap
FAILED_TESTS_SHOWN = 5
TAIL_CHARS = 600


@dataclass(frozen=True)
class Turn:
    """Where one sample's episode stands when a turn of it is scored."""

    turn: int  # 1-based
    max_turns: int
    subtask_index: int = 0  # a chain's step
    carried_code: str = ""  # a chain's code of the steps passed
    generated: bool = True  # False: nothing could be generated for it (an infrastructure failure)
    trainable: bool = True  # False: the learner will drop it as stale whatever follows (see ``stale_lag``)


@dataclass(frozen=True)
class TurnOutcome:
    """What follows a scored turn: the episode ends (with its verdict and reward) or continues
    (with the next turn's user message, step and carried code). The one rule the executor, the
    evaluator and ``rollstream eval`` play episodes by."""

    ends: bool
    passed: bool  # (ends) the episode passed: its turn passed, or every step of its chain
    reward: float  # (ends) the episode's reward
    progress: float | None  # (ends, a chain) steps passed + the failing step's share of tests, / steps
    observation: str = ""  # (continues) the next user turn
    subtask_index: int = 0  # (continues) the next turn's step
    carried_code: str = ""  # (continues) the code carried into it


def decide(spec: RewardSpec, state: Turn, completion_text: str, reward: float, execution: ExecutionRecord,
           events: Sequence[dict[str, Any]] = ()) -> TurnOutcome:
    """The episode after a turn whose scored reward is ``reward`` and execution ``execution``."""
    steps = len(spec.subtasks)
    passed = execution.passed
    last_step = state.subtask_index + 1 >= steps
    ends = (state.turn >= state.max_turns or not state.generated or not state.trainable
            or execution.error_kind in ("tamper", "infra") or (passed and (not steps or last_step)))
    if ends:
        if execution.error_kind == "infra":  # the machinery lost the turn: the episode is no reward
            return TurnOutcome(True, False, 0.0, None)
        if not steps:
            return TurnOutcome(True, passed, final_reward(spec, reward, state.turn) if state.turn > 1 else reward, None)
        done = _progress(steps, state.subtask_index, execution)
        return TurnOutcome(True, passed and last_step, final_reward(spec, done, state.turn), done)
    if steps and passed:  # on to the next step, with this turn's code carried
        step = state.subtask_index + 1
        told = (f"Step {step} passed. Step {step + 1} of {steps}: {spec.subtasks[step].instruction}\n"
                "Answer with the code of this step in one ```python block; what you wrote before is kept.")
        carried = _chain_code(state.carried_code, completion_text) or state.carried_code
        return TurnOutcome(False, False, reward, None, told[:OBSERVATION_CHARS], step, carried)
    shown = turn_spec(spec, state.subtask_index, state.carried_code, completion_text)[0] if steps else spec
    return TurnOutcome(False, False, reward, None, observation(shown, execution, events, chain=bool(steps)),
                       state.subtask_index, state.carried_code)


def turn_of(action: ActionGenerated) -> Turn:
    return Turn(action.turn, action.max_turns, action.subtask_index, action.carried_code, action.error is None)


def ends(action: ActionGenerated, execution: ExecutionRecord) -> bool:
    """Whether the episode ends after this turn (else it continues)."""
    return decide(action.reward, turn_of(action), action.completion_text, 0.0, execution).ends


def _chain_code(carried: str, completion_text: str) -> str | None:
    """A chain turn's code to run: the code carried from the steps passed, then this turn's (None:
    the turn has no code)."""
    new = extract_code(completion_text).code
    if new is None or not carried.strip():
        return new
    return f"{carried.rstrip()}\n\n\n{new}"


def turn_spec(spec: RewardSpec, subtask_index: int, carried_code: str, completion_text: str
              ) -> tuple[RewardSpec, str] | None:
    """For a turn of a subtask chain: its step's spec (the step's tests, checked against the
    references of the steps so far) and the completion to run (the carried code, then the turn's);
    None for a plain task."""
    if not spec.subtasks:
        return None
    index = min(subtask_index, len(spec.subtasks) - 1)
    step = spec.subtasks[index]
    step_spec = msgspec.structs.replace(spec, tests=list(step.tests), subtasks=[], entry_point="",
                                        reference=step_reference(spec, index))
    code = _chain_code(carried_code, completion_text)
    if code is None:  # nothing to run: scored as such
        return step_spec, completion_text
    return step_spec, f"```python\n{code}\n```"


def turn_code(action: ActionGenerated) -> str:
    """The code a turn is scored on: its completion's code, after a chain's carried code ("" when
    it has none). What a verdict's attestation digests (rollstream/attest.py)."""
    step = subtask_turn(action)
    completion = step[1] if step is not None else action.completion_text
    return extract_code(completion).code or ""


def subtask_turn(action: ActionGenerated) -> tuple[RewardSpec, str] | None:
    """:func:`turn_spec` of an action."""
    return turn_spec(action.reward, action.subtask_index, action.carried_code, action.completion_text)


def step_reference(spec: RewardSpec, index: int) -> str:
    """The reference a chain step is checked against: the references of the steps up to it, in order
    (what a correct episode has carried), else the task's whole reference. It tells the judge how the
    step's tests read their names (a helper called ``chunk`` is the task's, not the module)."""
    steps = [s.reference for s in spec.subtasks[: index + 1]]
    if all(steps):
        return "\n\n\n".join(r.rstrip() for r in steps if r is not None) + "\n"
    return spec.reference


def _progress(steps: int, subtask_index: int, execution: ExecutionRecord) -> float:
    """A chain's progress after a turn: steps passed, plus the failing step's share of tests."""
    if execution.passed:
        return (subtask_index + 1) / steps
    partial = execution.tests_passed / execution.tests_total if execution.tests_total else 0.0
    return (subtask_index + partial) / steps


def stale_lag(action: ActionGenerated, learner_version: int, max_staleness: int) -> int | None:
    """How many versions past ``max_staleness`` the episode's oldest weights already are behind the
    learner's (None: within it). The learner's version only grows and it drops a rollout whose
    oldest version lags more than ``rl.max_staleness`` (``rollstream.weights.versions_past``), so such an episode can
    never be trained: its next turns would be generated, executed and thrown away, holding one of
    the sampler's slots meanwhile. The executor ends it instead (as if its turns were spent)."""
    oldest = min([*action.policy_versions, action.rollout.policy_version_first])
    return versions_past(learner_version, oldest, max_staleness) or None


def after_turn(action: ActionGenerated, scored: RewardScored, events: Sequence[dict[str, Any]] = (),
               *, now: float | None = None, workspace: Sequence[tuple[str, bytes]] = (),
               trainable: bool = True) -> tuple[str, Any]:
    """What the executor sends after scoring a turn: ``("rewards", the episode's RewardScored)`` when
    the episode ends, else ``("prompts", the continuation for its next turn)``, which carries the
    files the turn left (``workspace``: its sandbox's /work after it ran, size-capped).
    ``trainable=False`` (``stale_lag``) ends the episode after this turn."""
    files = [WorkspaceFile(path=path, data=data) for path, data in workspace]
    state = dataclasses.replace(turn_of(action), trainable=trainable)
    outcome = decide(action.reward, state, action.completion_text, scored.reward, scored.execution, events)
    if outcome.ends:
        if outcome.progress is not None:
            scored = msgspec.structs.replace(scored, reward=outcome.reward, components={"progress": outcome.progress})
        elif action.turn > 1:
            scored = msgspec.structs.replace(scored, reward=outcome.reward)
        return "rewards", scored
    return "prompts", continuation_of(action, outcome.observation, now=now, subtask_index=outcome.subtask_index,
                                      carried_code=outcome.carried_code, workspace=files)


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
    elif verdict == "compile_error":
        lines.append(f"Your program does not compile: {execution.error_message}")
    elif verdict == "timeout":
        lines.append(f"Your code ran out of time ({spec.timeout_s:g} s).")
    elif verdict == "oom":
        lines.append("Your code ran out of memory.")
    elif verdict == "output_limit":
        lines.append("Your code wrote too much output.")
    elif verdict == "no_code":
        lines.append(f"Your answer has no code: put the code in a ```{spec.language} block.")
    elif verdict == "fail":
        lines.append(f"{execution.tests_passed} of {execution.tests_total} tests passed.")
    else:
        lines.append(f"Your code failed ({verdict}): {execution.error_message}".rstrip(": "))
    # the verdict's own per-test results (those of ``events`` for a record written without them)
    results = list(execution.test_results) or per_test_results(list(events), tests_total(spec, list(events)))[0]
    failed = [r for r in results if r.outcome in ("failed", "error")]
    for result in failed[:FAILED_TESTS_SHOWN]:
        # a pytest file's test by its node id, a statement test by its text
        test = result.node_id or (spec.tests[result.index] if result.index < len(spec.tests) else "?")
        why = f"{result.error_type}: {result.message}".strip(": ")
        lines.append(f"Failed: {test.strip()[:300]}" + (f" ({why[:300]})" if why else ""))
    if len(failed) > FAILED_TESTS_SHOWN:
        lines.append(f"... and {len(failed) - FAILED_TESTS_SHOWN} more failing tests.")
    if verdict not in ("fail", "syntax", "compile_error") and execution.stderr_tail.strip():
        lines.append("stderr:\n" + execution.stderr_tail.strip()[-TAIL_CHARS:])
    lines.append("Fix it and answer with this step's corrected code in one ```python block; what the steps "
                 "passed defined is kept." if chain else
                 f"Fix it and answer with the whole corrected code in one ```{spec.language} block.")
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
