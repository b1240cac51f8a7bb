"""Every event survives encode -> decode unchanged, for hypothesis-generated values."""

from __future__ import annotations

import keyword
import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollstream.schemas import TOPICS, Codec, SchemaError, codec, dlq_spec
from rollstream.schemas.arrays import LogProbArray, MaskArray, TokenArray, dec_hook, enc_hook
from rollstream.schemas.events import (
    SCHEMA_VERSION,
    ActionGenerated,
    DeadLetter,
    EvalReported,
    GroupAdvantaged,
    GroupFate,
    PromptIssued,
    RewardScored,
    SandboxAudit,
    WeightsPublished,
)
from rollstream.testing import make_action, make_prompt, make_reward

pytestmark = pytest.mark.unit

EVENTS = [PromptIssued, ActionGenerated, RewardScored, GroupAdvantaged, GroupFate, WeightsPublished, SandboxAudit,
          DeadLetter, EvalReported]

_texts = st.text(max_size=40)
_ids = st.text(min_size=1, max_size=20)
_finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
_logprob = st.floats(min_value=-1e4, max_value=0.0, allow_nan=False)
_stamp = st.floats(min_value=0, max_value=2e9, allow_nan=False)
_tokens = st.lists(st.integers(0, 2**31 - 1), max_size=20)


@st.composite
def rollouts(draw):
    completion = draw(_tokens)
    mask = draw(st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=len(completion), max_size=len(completion))))
    group_id = draw(_ids)
    index = draw(st.integers(0, 1000))
    first = draw(st.integers(0, 10**6))
    return {
        "rollout_id": f"{group_id}/{index}", "group_id": group_id, "sample_index": index,
        "group_size": draw(st.integers(1, 1024)), "task_id": draw(_ids), "family": draw(_ids),
        "prompt_token_ids": draw(_tokens), "completion_token_ids": completion,
        "behaviour_logprobs": draw(st.lists(_logprob, min_size=len(completion), max_size=len(completion))),
        "generated_mask": mask, "logprob_temperature": draw(st.floats(0.0, 10.0)),
        "policy_version_first": first, "policy_version_last": first + draw(st.integers(0, 5)),
        "issued_policy_version": draw(st.integers(0, 10**6)),
        "finish_reason": draw(st.sampled_from(["stop", "length", "abort", "error"])),
    }


_names = st.just("") | st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,20}\Z").filter(lambda n: not keyword.iskeyword(n))
_reward_spec = st.fixed_dictionaries({
    "entry_point": _names, "tests": st.lists(_texts, max_size=5),
    "timeout_s": st.floats(0.01, 600.0), "all_or_nothing": st.booleans(),
    "weights": st.dictionaries(_ids, _finite, max_size=3),
})
_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _texts}),
    min_size=1, max_size=4,
)
_execution = st.fixed_dictionaries({
    "sandbox_id": _texts, "exit_code": st.one_of(st.none(), st.integers(-255, 255)),
    "duration_s": st.floats(0, 1e3), "error_kind": st.sampled_from(["none", "syntax", "timeout", "oom"]),
    "error_line": st.one_of(st.none(), st.integers(0, 10**4)), "tests_passed": st.integers(0, 50),
    "tests_total": st.integers(0, 50), "stdout_tail": _texts, "stderr_tail": _texts,
})

STRATEGIES = {
    PromptIssued: st.fixed_dictionaries({
        "group_id": _ids, "task_id": _ids, "family": _ids, "messages": _messages,
        "group_size": st.integers(1, 1024), "reward": _reward_spec,
        "sampling": st.fixed_dictionaries({"temperature": st.one_of(st.none(), st.floats(0, 10)),
                                           "stop": st.one_of(st.none(), st.lists(_texts, max_size=3))}),
        "max_turns": st.integers(1, 64), "issued_policy_version": st.integers(0, 10**9), "issued_at": _stamp,
    }),
    ActionGenerated: st.fixed_dictionaries({
        "rollout": rollouts(), "completion_text": _texts, "reward": _reward_spec,
        "error": st.one_of(st.none(), _texts), "generator_id": _texts,
        "queued_s": st.floats(0, 1e3), "generate_s": st.floats(0, 1e3), "generated_at": _stamp,
    }),
    RewardScored: st.fixed_dictionaries({
        "rollout": rollouts(), "reward": _finite, "components": st.dictionaries(_ids, _finite, max_size=3),
        "execution": _execution, "executor_id": _texts, "scored_at": _stamp,
    }),
    GroupAdvantaged: st.fixed_dictionaries({
        "group_id": _ids, "task_id": _ids, "family": _ids, "estimator": _ids, "complete": st.booleans(),
        "rollouts": st.lists(st.fixed_dictionaries({"rollout": rollouts(), "reward": _finite,
                                                    "advantage": _finite}), min_size=1, max_size=3),
        "stats": st.fixed_dictionaries({"size": st.integers(0, 8), "expected_size": st.integers(1, 8),
                                        "reward_mean": _finite, "reward_std": st.floats(0, 1e6),
                                        "reward_min": _finite, "reward_max": _finite}),
        "emitted_at": _stamp,
    }),
    GroupFate: st.fixed_dictionaries({
        "group_id": _ids, "task_id": _ids, "family": _ids,
        "fate": st.sampled_from(["trained", "stale", "filtered", "duplicate", "invalid"]), "reason": _texts,
        "step": st.integers(0, 10**9), "policy_version": st.integers(0, 10**9),
        "learner_version": st.integers(0, 10**9), "rollouts": st.integers(0, 1024),
        "rollouts_trained": st.integers(0, 1024), "rollouts_stale": st.integers(0, 1024),
        "behaviour_versions": st.lists(st.integers(0, 10**9), max_size=4), "learner_run": _texts,
        "source_partition": st.integers(0, 10**4), "source_offset": st.integers(0, 2**62), "decided_at": _stamp,
    }),
    WeightsPublished: st.fixed_dictionaries({
        "version": st.integers(0, 10**9), "step": st.integers(0, 10**9), "manifest_key": _texts,
        "checksum": _texts, "num_bytes": st.integers(0, 2**40), "dtype": _texts, "published_at": _stamp,
    }),
    EvalReported: st.fixed_dictionaries({
        "version": st.integers(0, 10**9), "step": st.integers(0, 10**9), "scope": st.sampled_from(["live", "final"]),
        "status": st.sampled_from(["evaluated", "skipped"]), "reason": _texts,
        "families": st.lists(st.fixed_dictionaries({
            "family": _texts, "tasks": st.integers(0, 10**4), "samples": st.integers(0, 10**5),
            "pass_at": st.dictionaries(st.sampled_from(["1", "2", "5"]), st.floats(0, 1)),
            "mean_reward": _finite, "with_code": st.one_of(st.none(), st.floats(0, 1)),
            "ci_low": st.one_of(st.none(), st.floats(0, 1)), "forgetting": st.booleans()}), max_size=3),
        "domains": st.lists(st.fixed_dictionaries({
            "domain": st.sampled_from(["code", "math"]), "tasks": st.integers(0, 10**4),
            "samples": st.integers(0, 10**5), "pass1": st.one_of(st.none(), st.floats(0, 1)),
            "ci_high": st.one_of(st.none(), st.floats(0, 1)), "forgetting": st.booleans(),
            "rising": st.booleans()}), max_size=2),
        "samples": st.integers(0, 10**6), "turns": st.integers(1, 8), "seed": st.integers(-2**31, 2**31),
        "task_digest": _texts, "heldout_digest": _texts, "duration_s": st.floats(0, 1e5), "reported_at": _stamp,
    }),
    SandboxAudit: st.fixed_dictionaries({
        "sandbox_id": _texts, "container_id": _texts, "rollout_id": _texts, "code_sha256": _texts,
        "limits": st.fixed_dictionaries({"timeout_s": st.floats(0, 100), "memory_mb": st.integers(0, 10**5),
                                         "pids": st.integers(0, 10**4), "cpus": st.floats(0, 64),
                                         "output_bytes": st.integers(0, 10**9), "tmpfs_mb": st.integers(0, 10**4)}),
        "duration_s": st.floats(0, 1e3), "output_bytes": st.integers(0, 10**9),
        "verdict": st.sampled_from(["none", "timeout", "violation"]), "violations": st.lists(_texts, max_size=3),
        "recycled": st.booleans(), "executed_at": _stamp,
    }),
    DeadLetter: st.fixed_dictionaries({
        "topic": _texts, "partition": st.integers(0, 10**4), "offset": st.integers(0, 2**62),
        "key": st.one_of(st.none(), st.binary(max_size=20)), "value": st.one_of(st.none(), st.binary(max_size=50)),
        "reason": _texts, "stage": _texts, "failed_at": _stamp,
    }),
}


@pytest.mark.parametrize("event_type", EVENTS, ids=lambda t: t.__name__)
def test_round_trip(event_type: type) -> None:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(STRATEGIES[event_type])
    def check(fields: dict) -> None:
        event = msgspec.convert(fields, event_type, dec_hook=dec_hook)
        assert event.schema_version == SCHEMA_VERSION
        c = codec(event_type)
        decoded = c.decode(c.encode(event))
        assert decoded == event
        assert c.encode(decoded) == c.encode(event)

    check()


def test_every_topic_has_a_codec_and_key() -> None:
    for name, spec in TOPICS.items():
        assert spec.event in EVENTS, name
        assert isinstance(codec(spec.event), Codec)
    assert dlq_spec("rewards").name == "rewards.dlq"


@pytest.mark.parametrize(
    ("field", "value"),
    [("issued_at", math.nan), ("issued_at", math.inf), ("group_size", 0), ("group_size", 5000), ("group_id", "")],
)
def test_out_of_range_values_are_rejected(field: str, value: object) -> None:
    valid = msgspec.to_builtins(make_prompt())
    bad = msgspec.msgpack.encode({**valid, field: value})
    with pytest.raises(SchemaError, match=field):
        codec(PromptIssued).decode(bad)


def test_logprobs_must_match_completion_length() -> None:
    fields = msgspec.to_builtins(make_reward(), enc_hook=enc_hook, builtin_types=(bytes,))
    fields["rollout"] = {**fields["rollout"], "completion_token_ids": [1, 2], "behaviour_logprobs": [-1.0],
                         "generated_mask": None}
    with pytest.raises(SchemaError, match="behaviour_logprobs"):
        codec(RewardScored).decode(msgspec.msgpack.encode(fields))


def test_positive_logprob_is_rejected() -> None:
    fields = msgspec.to_builtins(make_action(), enc_hook=enc_hook, builtin_types=(bytes,))
    fields["rollout"] = {**fields["rollout"], "completion_token_ids": [1], "behaviour_logprobs": [0.5],
                         "generated_mask": None}
    with pytest.raises(SchemaError):
        codec(ActionGenerated).decode(msgspec.msgpack.encode(fields))


def test_arrays_travel_packed_and_decode_as_arrays() -> None:
    event = make_reward()  # 4 completion tokens, 10..13, each with log-prob -0.5
    wire = msgspec.msgpack.decode(codec(RewardScored).encode(event))["rollout"]
    assert wire["completion_token_ids"] == TokenArray([10, 11, 12, 13]).tobytes()
    assert wire["behaviour_logprobs"] == LogProbArray([-0.5] * 4).tobytes()
    rollout = codec(RewardScored).decode(codec(RewardScored).encode(event)).rollout
    assert type(rollout.completion_token_ids) is TokenArray and rollout.completion_token_ids == [10, 11, 12, 13]
    assert type(rollout.behaviour_logprobs) is LogProbArray and rollout.behaviour_logprobs.tolist() == [-0.5] * 4


@pytest.mark.parametrize(
    ("field", "packed", "reason"),
    [
        ("completion_token_ids", TokenArray([5]).tobytes()[:3], "whole number"),
        ("completion_token_ids", (-1).to_bytes(4, "little", signed=True), r"\[0, 2\*\*31\)"),
        ("behaviour_logprobs", LogProbArray([math.nan]).tobytes(), "finite"),
        ("behaviour_logprobs", LogProbArray([-math.inf]).tobytes(), "finite"),
        ("behaviour_logprobs", LogProbArray([1e-30]).tobytes(), "finite"),
        ("behaviour_logprobs", LogProbArray([-2e4]).tobytes(), "finite"),
        ("generated_mask", bytes([2]), "0 or 1"),
    ],
)
def test_bad_packed_values_are_rejected_with_the_field(field: str, packed: bytes, reason: str) -> None:
    fields = msgspec.to_builtins(make_reward(), enc_hook=enc_hook, builtin_types=(bytes,))
    one_token = {"completion_token_ids": TokenArray([5]).tobytes(), "behaviour_logprobs": LogProbArray([-0.5]).tobytes(),
                 "generated_mask": bytes([1])}
    fields["rollout"] = {**fields["rollout"], **one_token, field: packed}
    with pytest.raises(SchemaError, match=reason) as caught:
        codec(RewardScored).decode(msgspec.msgpack.encode(fields))
    assert field in str(caught.value)


def test_constructors_take_lists_and_check_them() -> None:
    rollout = make_reward().rollout
    replaced = msgspec.structs.replace(rollout, prompt_token_ids=[7, 8], generated_mask=[1, 0, 1, 1])
    assert type(replaced.prompt_token_ids) is TokenArray and type(replaced.generated_mask) is MaskArray
    with pytest.raises(ValueError, match="token ids"):
        msgspec.structs.replace(rollout, prompt_token_ids=[-3])


@pytest.mark.parametrize("name", sorted(TOPICS))
def test_a_record_nested_too_deeply_is_a_schema_error_not_a_crash(name: str) -> None:
    """A hostile record nested 100000 levels deep in a field the schema does not know: a
    RecursionError in decoding would crash every consuming stage on every restart; it is a
    SchemaError, which the consumer dead-letters."""
    deep = b"\x81\xa4junk" + b"\x91" * 100_000 + b"\xc0"  # {"junk": [[[...[nil]...]]]}
    with pytest.raises(SchemaError, match="nested too deeply"):
        codec(TOPICS[name].event).decode(deep)
