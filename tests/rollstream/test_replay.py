"""Replay's pure parts: which actions a selection takes, the spec each is re-scored with, the
re-scoring loop around a scorer, and the summary of what changed (the command end to end, on a
real run's archive and the sandbox, is tests/e2e/test_archive.py)."""

from __future__ import annotations

import msgspec
import pytest

from rollstream.errors import ConfigError, SandboxError
from rollstream.replay import (
    Item,
    Selection,
    SpecSource,
    apply_spec_overrides,
    outcome_json,
    parse_time,
    rescore,
    summarise,
)
from rollstream.schemas.events import ActionGenerated, RewardScored, RewardSpec
from rollstream.testing import make_action, make_reward

pytestmark = pytest.mark.unit


def item(group: str, index: int, *, before: float | None = 1.0, offset: int = 0) -> Item:
    action = make_action(group, index)
    reward = None if before is None else msgspec.structs.replace(make_reward(group, index, before),
                                                                 rollout=action.rollout)
    return Item(partition=0, offset=offset, timestamp_ms=1_000_000, action=action, before=reward)


def test_a_selection_matches_on_every_field_it_names() -> None:
    action = make_action("g1", 2)
    assert Selection().matches(3, 10, 5_000, action)
    assert Selection(groups={"g1"}, partitions={3}, from_offset=10, to_offset=10).matches(3, 10, 5_000, action)
    assert not Selection(groups={"g2"}).matches(3, 10, 5_000, action)
    assert not Selection(partitions={1}).matches(3, 10, 5_000, action)
    assert not Selection(since=6.0).matches(3, 10, 5_000, action)
    assert Selection(until=5.0).matches(3, 10, 5_000, action)
    assert Selection(groups={"g1"}, from_offset=4).filters() == [("group_id", "in", ["g1"]), ("offset", ">=", 4)]
    assert Selection().filters() is None


def test_times_read_as_unix_seconds_or_iso() -> None:
    assert parse_time("12.5") == 12.5 and parse_time(None) is None
    assert parse_time("1970-01-01T00:01:00") == 60.0  # UTC unless it says
    with pytest.raises(ConfigError, match="cannot read the time"):
        parse_time("yesterday")


def test_spec_overrides_set_fields_and_single_weights_and_refuse_the_rest() -> None:
    spec = RewardSpec(entry_point="f", tests=["assert f() == 1"])
    changed = apply_spec_overrides(spec, ["timeout_s=1.5", "weights.tests=2", 'tests=["assert f() == 2"]'])
    assert changed.timeout_s == 1.5 and changed.weights["tests"] == 2 and changed.tests == ["assert f() == 2"]
    assert apply_spec_overrides(spec, []) is spec
    for bad in ("nonsense=1", "timeout_s", "limits.x=1"):
        with pytest.raises(ConfigError):
            apply_spec_overrides(spec, [bad])


def test_spec_source_overrides_each_recorded_spec() -> None:
    action = make_action("g", 0)
    assert SpecSource(None, []).spec_for(action) is action.reward
    specs = SpecSource(None, ["timeout_s=2"])
    first, again = specs.spec_for(action), specs.spec_for(make_action("h", 1))
    assert first.timeout_s == 2.0 and first.tests == action.reward.tests and again == first
    with pytest.raises(ConfigError):
        SpecSource(None, ["timeout_s=-1"])  # a bad override fails before anything runs


async def test_rescore_keeps_the_order_and_records_errors_and_changes() -> None:
    items = [item("g", 0, offset=1), item("g", 1, offset=2), item("g", 2, before=None, offset=3)]
    done = []

    async def score(action: ActionGenerated) -> RewardScored:
        if action.rollout.sample_index == 1:
            raise SandboxError("no sandbox")
        return msgspec.structs.replace(make_reward("g", action.rollout.sample_index, 0.0), rollout=action.rollout)

    outcomes = await rescore(items, SpecSource(None, []), score, concurrency=2, done=lambda: done.append(1))
    assert [o.item for o in outcomes] == items and len(done) == 3
    assert outcomes[0].changed and outcomes[1].error == "SandboxError: no sandbox" and not outcomes[2].changed
    summary = summarise(outcomes)["all"]
    assert summary == {"rollouts": 3, "reward_before": 1.0, "reward_after": 0.0, "changed": 1, "flipped_to_pass": 0,
                       "flipped_to_fail": 0, "errors": 1, "not_scored_before": 1}
    line = outcome_json(outcomes[0])
    assert line["before"]["reward"] == 1.0 and line["after"]["reward"] == 0.0 and line["changed"]
