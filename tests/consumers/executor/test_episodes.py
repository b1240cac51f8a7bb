"""Multi-turn episode logic (consumers/executor/episodes.py), pure: when an episode ends, what the observation
says, what a continuation carries, and the rollout the next turn makes of it."""

from __future__ import annotations

import msgspec
import pytest

from rollstream.consumers.executor.episodes import (
    OBSERVATION_CHARS,
    continuation_of,
    ends,
    final_reward,
    observation,
)
from rollstream.consumers.generator.turns import continued, continued_rollout
from rollstream.schemas import PromptIssued, codec
from rollstream.schemas.events import ExecutionRecord, RewardSpec
from rollstream.testing import make_action

pytestmark = pytest.mark.unit
SPEC = RewardSpec(entry_point="f", tests=["assert f(1) == 2", "assert f(2) == 3", "assert f(0) == 1"],
                  turn_penalty=0.25)
FAIL = ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1, error_kind="none", tests_passed=1, tests_total=3)
PASS = msgspec.structs.replace(FAIL, tests_passed=3)
SYNTAX = ExecutionRecord(sandbox_id="s", exit_code=1, duration_s=0.1, error_kind="syntax", error_line=2,
                         error_message="invalid syntax")


def episode(turn: int = 1, max_turns: int = 3):
    action = make_action("g", 1)
    return msgspec.structs.replace(action, reward=SPEC, turn=turn, max_turns=max_turns)


def test_an_episode_ends_on_a_pass_on_its_last_turn_or_without_a_completion() -> None:
    assert not ends(episode(1), FAIL) and not ends(episode(2), SYNTAX)
    assert ends(episode(1), PASS) and ends(episode(3), FAIL)
    assert ends(msgspec.structs.replace(episode(1), error="prompt too long"), FAIL)
    assert ends(episode(1, max_turns=1), FAIL)  # one-shot tasks are unchanged
    assert final_reward(SPEC, 1.0, 1) == 1.0 and final_reward(SPEC, 1.0, 3) == 0.5


def test_the_observation_names_the_failing_tests_and_is_capped() -> None:
    events = [{"e": "test", "i": 0, "ok": True}, {"e": "test", "i": 1, "ok": False, "type": "AssertionError",
                                                    "msg": ""}, {"e": "test", "i": 2, "ok": False, "type": "KeyError",
                                                                 "msg": "'x'"}]
    text = observation(SPEC, FAIL, events)
    assert "1 of 3 tests passed" in text
    assert "Failed: assert f(2) == 3 (AssertionError)" in text and "Failed: assert f(0) == 1 (KeyError: 'x')" in text
    assert "assert f(1) == 2" not in text  # it passed
    assert "does not compile (line 2): invalid syntax" in observation(SPEC, SYNTAX)
    huge = [{"e": "test", "i": 0, "ok": False, "type": "E", "msg": "x" * 5000}] * 50
    assert len(observation(SPEC, FAIL, huge)) <= OBSERVATION_CHARS


def test_a_continuation_carries_the_transcript_and_the_next_turn_extends_it() -> None:
    action = episode(1)
    event = continuation_of(action, "1 of 3 tests passed.", now=5.0)
    event = codec(PromptIssued).decode(codec(PromptIssued).encode(event))  # as it travels
    c = event.continuation
    turn1 = list(action.rollout.completion_token_ids)
    assert (event.group_id, c.sample_index, c.turn, event.max_turns) == ("g", 1, 2, 3)
    assert list(c.completion_token_ids) == turn1 and list(c.generated_mask) == [1] * len(turn1)
    assert continued(event, [7, 8]) == list(action.rollout.prompt_token_ids) + turn1 + [7, 8]
    rollout = continued_rollout(event, [7, 8], [5, 6, 9], [-0.5, -0.25, -1.0], version_first=4, version_last=5,
                                finish_reason="stop", logprob_temperature=1.0)
    assert list(rollout.completion_token_ids) == turn1 + [7, 8, 5, 6, 9]
    assert list(rollout.generated_mask) == [1] * len(turn1) + [0, 0, 1, 1, 1]
    assert list(rollout.behaviour_logprobs)[len(turn1):] == [0.0, 0.0, -0.5, -0.25, -1.0]
    # staleness counts from the oldest version that produced any of its tokens
    assert rollout.policy_version_first == min(action.rollout.policy_version_first, 4)
    assert rollout.policy_version_last == 5 and rollout.rollout_id == "g/1"


def test_a_chain_moves_step_by_step_carrying_the_code_and_rewards_progress() -> None:
    from rollstream.consumers.executor.episodes import after_turn, subtask_turn
    from rollstream.schemas.events import RewardScored, Subtask

    chain = RewardSpec(tests=["assert f() == 1", "assert g() == 2", "assert h() == 3", "assert h() != 0"],
                       turn_penalty=0.1, subtasks=[
                           Subtask(instruction="write f", tests=["assert f() == 1"]),
                           Subtask(instruction="write g, using f", tests=["assert g() == 2"]),
                           Subtask(instruction="write h", tests=["assert h() == 3", "assert h() != 0"])])

    def turn(step: int, turn: int, carried: str, code: str):
        return msgspec.structs.replace(make_action("c", 0), reward=chain, turn=turn, max_turns=5, subtask_index=step,
                                       carried_code=carried, completion_text=f"```python\n{code}\n```")

    def scored(action, execution):
        return RewardScored(rollout=action.rollout, reward=0.0, components={}, execution=execution,
                            executor_id="e", scored_at=0.0)

    one = turn(0, 1, "", "def f():\n    return 1")
    spec, completion = subtask_turn(one)
    assert spec.tests == ["assert f() == 1"] and spec.subtasks == [] and "def f()" in completion
    passed = msgspec.structs.replace(PASS, tests_passed=1, tests_total=1)
    topic, event = after_turn(one, scored(one, passed), now=1.0)
    c = event.continuation
    assert topic == "prompts" and (c.subtask_index, c.turn) == (1, 2) and "write g, using f" in c.observation
    assert c.carried_code.strip() == "def f():\n    return 1"
    two = turn(1, 2, c.carried_code, "def g():\n    return f() + 1")
    assert "def f()" in subtask_turn(two)[1] and "def g()" in subtask_turn(two)[1]  # run together
    failed = msgspec.structs.replace(FAIL, tests_passed=0, tests_total=1)
    topic, event = after_turn(two, scored(two, failed), [{"e": "test", "i": 0, "ok": False}], now=1.0)
    assert topic == "prompts" and event.continuation.subtask_index == 1 and event.continuation.turn == 3
    assert event.continuation.carried_code == c.carried_code and "assert g() == 2" in event.continuation.observation
    # the turns run out on step 3 with half its tests: progress (2 + 1/2) / 3, less 4 turns' penalty
    last = msgspec.structs.replace(turn(2, 5, "...", "def h():\n    return 0"), max_turns=5)
    topic, final = after_turn(last, scored(last, msgspec.structs.replace(FAIL, tests_passed=1, tests_total=2)))
    assert topic == "rewards" and abs(final.components["progress"] - 2.5 / 3) < 1e-9
    assert abs(final.reward - (2.5 / 3 - 0.4)) < 1e-9
    done = turn(2, 3, "...", "def h():\n    return 3")
    topic, final = after_turn(done, scored(done, msgspec.structs.replace(PASS, tests_passed=2, tests_total=2)))
    assert topic == "rewards" and final.components == {"progress": 1.0} and abs(final.reward - 0.8) < 1e-9


def test_the_executor_and_the_evaluator_decide_an_episode_alike() -> None:
    """after_turn (the executor) and decide (the evaluator, rollstream eval) are one rule: the same
    end, verdict, reward and next step, on plain tasks and chains."""
    from rollstream.consumers.executor.episodes import Turn, after_turn, decide
    from rollstream.consumers.executor.rewards import Scored
    from rollstream.schemas.events import Subtask

    chain = msgspec.structs.replace(SPEC, subtasks=[Subtask(instruction="a", tests=["assert f(1) == 2"]),
                                                    Subtask(instruction="b", tests=["assert f(2) == 3"])])
    cases = [(SPEC, 1, 3, 0, FAIL, 0.33), (SPEC, 3, 3, 0, FAIL, 0.33), (SPEC, 2, 3, 0, PASS, 1.0),
             (chain, 1, 3, 0, PASS, 1.0), (chain, 2, 3, 1, PASS, 1.0), (chain, 3, 3, 1, FAIL, 0.0)]
    for spec, turn, max_turns, step, execution, reward in cases:
        action = msgspec.structs.replace(episode(turn, max_turns), reward=spec, subtask_index=step,
                                         completion_text="```python\ndef f(x):\n    return x + 1\n```")
        scored = Scored(reward=reward, components={"tests": reward}, execution=execution)
        where, sent = after_turn(action, make_reward_of(action, scored))
        outcome = decide(spec, Turn(turn, max_turns, step), action.completion_text, reward, execution)
        assert outcome.ends == (where == "rewards"), (spec.subtasks, turn, execution)
        if outcome.ends:
            assert sent.reward == pytest.approx(outcome.reward)
            assert outcome.passed == (execution.passed and (not spec.subtasks or step == len(spec.subtasks) - 1))
        else:
            assert sent.continuation.subtask_index == outcome.subtask_index
            assert sent.continuation.observation == outcome.observation


def make_reward_of(action, scored):
    from rollstream.schemas.events import RewardScored

    return RewardScored(rollout=action.rollout, reward=scored.reward, components=scored.components,
                        execution=scored.execution, executor_id="e", scored_at=1.0)


def test_an_episode_the_learner_would_drop_as_stale_ends_instead_of_playing_on() -> None:
    """Its oldest weights already more than rl.max_staleness versions behind the learner's (which
    only grows): the learner will drop it whatever follows, so the executor ends it after the turn
    being scored, rewarded as if its turns had run out; within the bound it plays on."""
    from rollstream.consumers.executor.episodes import after_turn, stale_lag
    from rollstream.schemas.events import RewardScored

    action = episode(2)
    rollout = msgspec.structs.replace(action.rollout, policy_version_first=5, policy_version_last=7)
    action = msgspec.structs.replace(action, rollout=rollout, policy_versions=[3, 5, 7])  # turn 1 was v3
    assert stale_lag(action, learner_version=4, max_staleness=1) is None  # 4 - 3 = 1: still trainable
    assert stale_lag(action, learner_version=6, max_staleness=1) == 2  # 6 - 3 > 1, by 2
    assert stale_lag(action, learner_version=6, max_staleness=3) is None
    scored = RewardScored(rollout=rollout, reward=1 / 3, components={}, execution=FAIL, executor_id="e", scored_at=0.0)
    assert after_turn(action, scored, now=1.0)[0] == "prompts"
    topic, final = after_turn(action, scored, now=1.0, trainable=False)
    assert topic == "rewards" and abs(final.reward - final_reward(SPEC, 1 / 3, 2)) < 1e-9
