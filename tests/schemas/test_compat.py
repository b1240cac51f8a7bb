"""The compatibility rule of schemas/events.py, checked.

``V1`` below are frozen copies of version-1 shapes as an older writer had them (fewer
fields: everything added since must have a default). Never edit them; add a V2 copy when
SCHEMA_VERSION changes.
"""

from __future__ import annotations

import msgspec
import pytest

from rollstream.schemas import PromptIssued, SchemaError, codec
from rollstream.schemas.events import SCHEMA_VERSION

pytestmark = pytest.mark.unit


class V1RewardSpec(msgspec.Struct, kw_only=True):
    kind: str = "python_tests"
    entry_point: str = ""
    tests: list[str] = []


class V1Message(msgspec.Struct, kw_only=True):
    role: str
    content: str


class V1PromptIssued(msgspec.Struct, kw_only=True):
    """PromptIssued as a minimal version-1 writer wrote it: no sampling, turns or continuation."""

    schema_version: int = 1
    group_id: str
    task_id: str
    family: str
    messages: list[V1Message]
    group_size: int
    reward: V1RewardSpec
    issued_policy_version: int
    issued_at: float


def test_an_older_writer_still_decodes() -> None:
    old = V1PromptIssued(
        group_id="g", task_id="t", family="f", messages=[V1Message(role="user", content="hi")],
        group_size=4, reward=V1RewardSpec(entry_point="f", tests=["assert f()"]),
        issued_policy_version=2, issued_at=1.0,
    )
    event = codec(PromptIssued).decode(msgspec.msgpack.encode(old))
    assert event.group_id == "g" and event.reward.tests == ["assert f()"]
    assert event.max_turns == 1 and event.continuation is None  # defaults fill what it lacked
    assert event.reward.timeout_s > 0


def test_unknown_fields_from_a_newer_minor_writer_are_ignored() -> None:
    old = msgspec.to_builtins(V1PromptIssued(
        group_id="g", task_id="t", family="f", messages=[V1Message(role="user", content="hi")],
        group_size=4, reward=V1RewardSpec(), issued_policy_version=0, issued_at=1.0,
    ))
    event = codec(PromptIssued).decode(msgspec.msgpack.encode({**old, "added_later": [1, 2]}))
    assert event.group_id == "g"


def test_a_newer_major_version_is_refused_with_the_reason() -> None:
    old = msgspec.to_builtins(V1PromptIssued(
        group_id="g", task_id="t", family="f", messages=[V1Message(role="user", content="hi")],
        group_size=4, reward=V1RewardSpec(), issued_policy_version=0, issued_at=1.0,
    ))
    with pytest.raises(SchemaError, match=f"schema_version <= {SCHEMA_VERSION}"):
        codec(PromptIssued).decode(msgspec.msgpack.encode({**old, "schema_version": SCHEMA_VERSION + 1}))


def test_every_field_added_to_an_event_has_a_default() -> None:
    """Fields beyond the frozen V1 shape must have defaults, or old records stop decoding."""
    v1 = {f.name for f in msgspec.structs.fields(V1PromptIssued)}
    for field in msgspec.structs.fields(PromptIssued):
        if field.name not in v1:
            assert field.required is False, f"PromptIssued.{field.name} was added without a default"


class V1Rollout(msgspec.Struct, kw_only=True):
    """A version-1 Rollout: token ids and log-probs as MessagePack arrays of numbers."""

    rollout_id: str
    group_id: str
    sample_index: int
    group_size: int
    task_id: str
    family: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    behaviour_logprobs: list[float]
    policy_version_first: int
    policy_version_last: int
    issued_policy_version: int
    finish_reason: str


class V1RewardScored(msgspec.Struct, kw_only=True):
    schema_version: int = 1
    rollout: V1Rollout
    reward: float
    components: dict[str, float]
    executor_id: str
    scored_at: float


class V1ExecutionRecord(msgspec.Struct, kw_only=True):
    sandbox_id: str
    exit_code: int | None
    duration_s: float
    error_kind: str


def test_version_1_arrays_of_numbers_still_decode_and_are_checked() -> None:
    from rollstream.schemas import RewardScored, TokenArray

    rollout = V1Rollout(rollout_id="g/0", group_id="g", sample_index=0, group_size=2, task_id="t", family="f",
                        prompt_token_ids=[1, 2, 70000], completion_token_ids=[5, 6], behaviour_logprobs=[-0.25, 0.0],
                        policy_version_first=0, policy_version_last=0, issued_policy_version=0, finish_reason="stop")
    old = msgspec.to_builtins(V1RewardScored(rollout=rollout, reward=1.0, components={"tests": 1.0},
                                                    executor_id="e", scored_at=1.0))
    old["execution"] = msgspec.to_builtins(V1ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1,
                                                             error_kind="none"))
    event = codec(RewardScored).decode(msgspec.msgpack.encode(old))
    assert type(event.rollout.prompt_token_ids) is TokenArray
    assert event.rollout.prompt_token_ids == [1, 2, 70000] and event.rollout.behaviour_logprobs == [-0.25, 0.0]
    old["rollout"]["behaviour_logprobs"] = [-0.25, float("nan")]
    with pytest.raises(SchemaError, match="log-probs"):
        codec(RewardScored).decode(msgspec.msgpack.encode(old))


class V2ExecutionRecord(msgspec.Struct, kw_only=True):
    """An execution record as a version-2 writer wrote it: no trust, no tamper."""

    sandbox_id: str
    exit_code: int | None
    duration_s: float
    error_kind: str
    tests_passed: int = 0
    tests_total: int = 0


def test_version_2_records_decode_and_say_their_verdict_was_not_judged() -> None:
    from rollstream.schemas import RewardScored

    rollout = V1Rollout(rollout_id="g/0", group_id="g", sample_index=0, group_size=2, task_id="t", family="f",
                        prompt_token_ids=[1], completion_token_ids=[5], behaviour_logprobs=[-0.5],
                        policy_version_first=0, policy_version_last=0, issued_policy_version=0, finish_reason="stop")
    old = msgspec.to_builtins(V1RewardScored(rollout=rollout, reward=1.0, components={"tests": 1.0},
                                             executor_id="e", scored_at=1.0))
    old["schema_version"] = 2
    old["execution"] = msgspec.to_builtins(V2ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1,
                                                             error_kind="none", tests_passed=3, tests_total=3))
    event = codec(RewardScored).decode(msgspec.msgpack.encode(old))
    assert event.execution.trust is None and event.execution.tamper == ""  # not a judge's verdict
    assert SCHEMA_VERSION == 5
    old["execution"]["error_kind"] = "tamper"  # what a version-2 reader could not have read
    assert codec(RewardScored).decode(msgspec.msgpack.encode(old)).execution.error_kind == "tamper"


def test_version_3_records_decode_with_nothing_skipped_or_lost() -> None:
    """Version 4 adds too_large, trust "mixed" and the skip / lost-guarantee fields: a version-3
    record still decodes, with their defaults."""
    from rollstream.schemas import RewardScored

    rollout = V1Rollout(rollout_id="g/0", group_id="g", sample_index=0, group_size=2, task_id="t", family="f",
                        prompt_token_ids=[1], completion_token_ids=[5], behaviour_logprobs=[-0.5],
                        policy_version_first=0, policy_version_last=0, issued_policy_version=0, finish_reason="stop")
    old = msgspec.to_builtins(V1RewardScored(rollout=rollout, reward=1.0, components={"tests": 1.0},
                                             executor_id="e", scored_at=1.0))
    old["schema_version"] = 3
    old["execution"] = {**msgspec.to_builtins(V2ExecutionRecord(sandbox_id="s", exit_code=0, duration_s=0.1,
                                                                error_kind="none", tests_passed=2, tests_total=2)),
                        "trust": "judge", "tamper": ""}
    execution = codec(RewardScored).decode(msgspec.msgpack.encode(old)).execution
    assert execution.tests_skipped == 0 and execution.lost_guarantees == [] and execution.in_process_tests == []
    assert execution.passed
    old["execution"].update(error_kind="too_large", trust="mixed", in_process_tests=[1], tests_skipped=1)
    execution = codec(RewardScored).decode(msgspec.msgpack.encode(old)).execution
    assert execution.error_kind == "too_large" and execution.trust == "mixed" and execution.in_process_tests == [1]
