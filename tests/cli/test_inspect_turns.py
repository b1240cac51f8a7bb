"""`rollstream inspect` of a multi-turn episode (pure: a stand-in for the archive's reader): the
sample shows every turn, the observation after each, and the final verdict."""

from __future__ import annotations

import msgspec
import pytest

from rollstream.cli.records import gather, render
from rollstream.consumers.executor.episodes import continuation_of
from rollstream.schemas.events import ExecutionRecord, RewardScored
from rollstream.testing import make_action, make_prompt

pytestmark = pytest.mark.unit

class Archive:
    def __init__(self, events: dict[str, list]) -> None:
        self.root, self._events = "mem", events

    def events(self, name, partitions=None, filters=None):
        return [({"partition": 0, "offset": i}, e) for i, e in enumerate(self._events.get(name, []))]

    def group_partitions(self, name, group_id):
        return None

    def files(self):
        return []


def test_inspect_shows_each_turn_and_the_observation_between() -> None:
    first = msgspec.structs.replace(make_action("g", 0), max_turns=2, completion_text="```python\nwrong\n```")
    continuation = continuation_of(first, "0 of 1 tests passed.\nFailed: assert add(1, 2) == 3", now=1.0)
    second = msgspec.structs.replace(first, turn=2, completion_text="```python\nright\n```")
    passed = ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1, error_kind="none", tests_passed=1,
                             tests_total=1)
    reward = RewardScored(rollout=second.rollout, reward=0.9, components={"tests": 1.0}, execution=passed,
                          executor_id="e", scored_at=2.0)
    found = gather(Archive({"prompts": [make_prompt("g", 1), continuation], "actions": [first, second],
                            "rewards": [reward]}), "g", None)
    [sample] = found["samples"]
    assert found["prompt"][0]["content"] == make_prompt("g", 1).messages[0].content  # the original, not the continuation
    assert [t["turn"] for t in sample["turns"]] == [1, 2] and sample["completion"] == second.completion_text
    assert sample["turns"][0]["observation_after"].startswith("0 of 1 tests passed")
    assert sample["turns"][1]["observation_after"] is None and sample["reward"] == 0.9
    text = render(found)
    assert text.index("--- turn 1 ---") < text.index("Failed: assert add(1, 2) == 3") < text.index("--- turn 2 ---")
