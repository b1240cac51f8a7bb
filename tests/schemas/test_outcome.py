"""Typed outcomes (schema version 5): one closed set, derived from the execution record, checked
on decode, and an ``infra`` outcome that can never carry a reward."""

from __future__ import annotations

import msgspec
import pytest

from rollstream.schemas import (
    OUTCOMES,
    SCHEMA_VERSION,
    ExcludedRollout,
    ExecutionRecord,
    GroupAdvantaged,
    GroupStats,
    RewardScored,
    SchemaError,
    codec,
    outcome_of,
)
from rollstream.schemas.events import ErrorKind
from rollstream.testing import make_reward

pytestmark = pytest.mark.unit


def as_map(event: RewardScored) -> dict:
    """The event as its MessagePack map (packed arrays kept as they travel)."""
    return msgspec.msgpack.decode(codec(RewardScored).encode(event))


def infra_reward(group_id: str = "g", index: int = 0, size: int = 4) -> RewardScored:
    event = make_reward(group_id, index, 0.0, group_size=size)
    record = ExecutionRecord(sandbox_id="", exit_code=None, duration_s=0.0, error_kind="infra",
                             error_message="the sandbox was lost under this job")
    return msgspec.structs.replace(event, components={}, execution=record, outcome="infra")


def test_every_error_kind_has_exactly_one_outcome_from_the_closed_set() -> None:
    assert SCHEMA_VERSION == 5
    assert set(OUTCOMES) == {"passed", "failed", "error", "timeout", "oom", "too_large", "violation", "infra"}
    for kind in ErrorKind.__args__:
        for passed in (True, False):
            assert outcome_of(kind, passed) in OUTCOMES
    assert (outcome_of("none", True), outcome_of("none", False)) == ("passed", "failed")
    assert outcome_of("tamper", False) == "violation" and outcome_of("syntax", False) == "error"
    assert outcome_of("infra", False) == "infra"


def test_the_outcome_is_derived_when_omitted_and_must_agree_when_given() -> None:
    event = make_reward("g", 0, 1.0)
    assert event.outcome == "passed"
    data = as_map(event)
    data.pop("outcome")
    data["schema_version"] = 4  # a version-4 writer knew no outcome
    assert codec(RewardScored).decode(msgspec.msgpack.encode(data)).outcome == "passed"
    data.update(outcome="failed", schema_version=5)  # a writer that says what its record does not
    with pytest.raises(SchemaError, match="does not match"):
        codec(RewardScored).decode(msgspec.msgpack.encode(data))


def test_an_infra_outcome_can_carry_no_reward() -> None:
    event = infra_reward()
    assert event.outcome == "infra" and event.reward == 0.0
    assert codec(RewardScored).decode(codec(RewardScored).encode(event)).outcome == "infra"
    for forged in ({"reward": 1.0}, {"components": {"tests": 0.0}}):
        data = {**as_map(event), **forged}
        with pytest.raises(SchemaError, match="no reward"):
            codec(RewardScored).decode(msgspec.msgpack.encode(data))


def test_a_group_may_be_empty_only_when_it_says_why() -> None:
    stats = GroupStats(size=0, expected_size=2, reward_mean=0.0, reward_std=0.0, reward_min=0.0, reward_max=0.0)
    excluded = [ExcludedRollout(rollout_id=f"g/{i}", sample_index=i, reason="lost") for i in range(2)]
    group = GroupAdvantaged(group_id="g", task_id="t", family="f", estimator="grpo", complete=True, rollouts=[],
                            stats=stats, emitted_at=1.0, filtered="infra", excluded=excluded)
    assert codec(GroupAdvantaged).decode(codec(GroupAdvantaged).encode(group)).excluded == excluded
    data = {**msgspec.to_builtins(group), "filtered": ""}
    with pytest.raises(SchemaError, match="must say why"):
        codec(GroupAdvantaged).decode(msgspec.msgpack.encode(data))
