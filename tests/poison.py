"""Poison records: what a hostile or broken producer can put on a stage's input topic.

:func:`poison` derives, from one valid event, records that must each be dead-lettered with their
bytes (and never stop the stage): byte-level garbage, schema violations, and schema-shaped values
that are out of range or impossible. :func:`tolerated` gives records that look odd but are valid
(unknown fields: the compatibility rule says readers skip them) and must be processed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

from rollstream.schemas import codec
from rollstream.schemas.arrays import enc_hook
from rollstream.schemas.events import Event

DEEP = b"\x81\xa4junk" + b"\x91" * 100_000 + b"\xc0"  # {"junk": [[[... 100000 levels ...]]]}
TIMESTAMPS = ("issued_at", "generated_at", "scored_at", "emitted_at", "decided_at", "published_at")


def fields_of(event: Event) -> dict[str, Any]:
    return msgspec.to_builtins(event, enc_hook=enc_hook, builtin_types=(bytes,))


def _encode(tree: Any) -> bytes:
    return msgspec.msgpack.encode(tree)


def _mutated(event: Event, change: Callable[[dict[str, Any]], None]) -> bytes:
    tree = fields_of(event)
    change(tree)
    return _encode(tree)


def _id_holder(tree: dict[str, Any]) -> dict[str, Any]:
    """The dict holding the group id (the event, or its rollout)."""
    return tree if "group_id" in tree else tree["rollout"]


def _rollout(tree: dict[str, Any]) -> dict[str, Any] | None:
    if "rollout" in tree:
        return tree["rollout"]
    if tree.get("rollouts"):
        return tree["rollouts"][0]["rollout"]
    return None


def poison(event: Event) -> list[tuple[str, bytes | None]]:
    """(kind, record value) pairs, each of which a consumer of ``event``'s topic must dead-letter."""
    good = codec(type(event)).encode(event)
    out: list[tuple[str, bytes | None]] = [
        ("not-msgpack", b"\xc1\xc1 this is not msgpack"),
        ("empty", b""),
        ("tombstone", None),
        ("truncated", good[: len(good) // 2]),
        ("trailing-bytes", good + b"\x00"),
        ("array-not-map", _encode([1, 2, 3])),
        ("scalar", _encode(42)),
        ("missing-fields", _encode({"schema_version": 3})),
        ("huge-length-header", b"\xdd\xff\xff\xff\xff"),
        ("nested-too-deeply", DEEP),
        ("future-schema-version", _mutated(event, lambda t: t.update(schema_version=99))),
        ("group-id-not-a-string", _mutated(event, lambda t: _id_holder(t).update(group_id=5))),
        ("group-id-empty", _mutated(event, lambda t: _id_holder(t).update(group_id=""))),
        ("group-id-too-long", _mutated(event, lambda t: _id_holder(t).update(group_id="g" * 300))),
    ]
    stamp = next((name for name in TIMESTAMPS if name in fields_of(event)), None)
    if stamp is not None:
        out.append(("timestamp-nan", _mutated(event, lambda t: t.update({stamp: math.nan}))))
        out.append(("timestamp-infinite", _mutated(event, lambda t: t.update({stamp: math.inf}))))
        out.append(("timestamp-negative", _mutated(event, lambda t: t.update({stamp: -1.0}))))
    if _rollout(fields_of(event)) is not None:
        rollout = event.rollout if hasattr(event, "rollout") else event.rollouts[0].rollout  # type: ignore[attr-defined]
        n = len(rollout.completion_token_ids)
        out += [
            ("finish-reason-unknown", _mutated(event, lambda t: _rollout(t).update(finish_reason="bogus"))),
            ("policy-version-negative", _mutated(event, lambda t: _rollout(t).update(policy_version_first=-1))),
            ("token-array-misaligned", _mutated(event, lambda t: _rollout(t).update(completion_token_ids=b"\x01\x02\x03"))),
            ("logprobs-fewer-than-tokens", _mutated(event, lambda t: _rollout(t).update(behaviour_logprobs=b""))),
            ("logprob-positive", _mutated(event, lambda t: _rollout(t).update(behaviour_logprobs=[0.5] * n))),
            ("token-id-negative", _mutated(event, lambda t: _rollout(t).update(completion_token_ids=[-1] * n))),
        ]
    if "messages" in fields_of(event):
        out.append(("message-role-unknown", _mutated(event, lambda t: t["messages"][0].update(role="root"))))
        out.append(("no-messages", _mutated(event, lambda t: t.update(messages=[]))))
        out.append(("group-size-zero", _mutated(event, lambda t: t.update(group_size=0))))
    if "rollouts" in fields_of(event):
        out.append(("no-rollouts", _mutated(event, lambda t: t.update(rollouts=[]))))
        out.append(("advantage-nan", _mutated(event, lambda t: t["rollouts"][0].update(advantage=math.nan))))
    return out


def tolerated(event: Event) -> list[tuple[str, bytes]]:
    """Odd but valid records of ``event``'s kind, which must be processed like the event itself."""
    return [("unknown-field", _mutated(event, lambda t: t.update(added_by_a_newer_writer={"x": [1, 2]})))]
