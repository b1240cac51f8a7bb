"""The topic registry: every topic's name, key field, event type and default partitions,
and one codec per topic, built once."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from rollstream.schemas.arrays import dec_hook, enc_hook
from rollstream.schemas.events import (
    SCHEMA_VERSION,
    ActionGenerated,
    DeadLetter,
    EvalReported,
    Event,
    GroupAdvantaged,
    GroupFate,
    PromptIssued,
    RewardScored,
    SandboxAudit,
    WeightsPublished,
)

E = TypeVar("E", bound=Event)


class SchemaError(ValueError):
    """A record that cannot be decoded as its topic's event (the DLQ reason says why)."""


@dataclass(frozen=True)
class TopicSpec(Generic[E]):
    name: str  # without prefix
    event: type[E]
    key: Callable[[E], bytes | None]
    partitions: int
    doc: str


def _by_group(event: Any) -> bytes:
    group_id = event.group_id if hasattr(event, "group_id") else event.rollout.group_id
    return group_id.encode()


TOPICS: dict[str, TopicSpec[Any]] = {
    spec.name: spec
    for spec in (
        TopicSpec("prompts", PromptIssued, _by_group, 8, "one PromptIssued per group (sampler -> generators)"),
        TopicSpec("actions", ActionGenerated, _by_group, 8, "one ActionGenerated per sample (generators -> executors)"),
        TopicSpec("rewards", RewardScored, _by_group, 8, "one RewardScored per sample (executors -> stream)"),
        TopicSpec("advantages", GroupAdvantaged, _by_group, 8, "one GroupAdvantaged per group (stream -> learner)"),
        TopicSpec("fates", GroupFate, _by_group, 8, "one GroupFate per group the learner consumed (learner)"),
        TopicSpec("policy", WeightsPublished, lambda e: None, 1, "one WeightsPublished per broadcast (learner)"),
        TopicSpec("audit", SandboxAudit, lambda e: e.sandbox_id.encode(), 4, "one SandboxAudit per execution"),
        TopicSpec("evals", EvalReported, lambda e: None, 1,
                  "one EvalReported per policy version the evaluator evaluated or skipped (evaluator)"),
    )
}
DLQ_SUFFIX = ".dlq"


def dlq_spec(name: str) -> TopicSpec[DeadLetter]:
    """The dead-letter topic of ``name``; its records keep the original key."""
    return TopicSpec(name + DLQ_SUFFIX, DeadLetter, lambda e: e.key, 1, f"dead letters of {name}")


def topic(name: str) -> TopicSpec[Any]:
    """The spec of a registered topic (or of a registered topic's DLQ)."""
    if name.endswith(DLQ_SUFFIX) and name[: -len(DLQ_SUFFIX)] in TOPICS:
        return dlq_spec(name[: -len(DLQ_SUFFIX)])
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; known: {', '.join(sorted(TOPICS))}") from None


class Codec(Generic[E]):
    """MessagePack encoder/decoder of one event type, with version checks."""

    def __init__(self, event: type[E]) -> None:
        self.event = event
        self._encoder = msgspec.msgpack.Encoder(enc_hook=enc_hook)
        self._decoder = msgspec.msgpack.Decoder(event, dec_hook=dec_hook)

    def encode(self, event: E) -> bytes:
        if not isinstance(event, self.event):
            raise TypeError(f"expected {self.event.__name__}, got {type(event).__name__}")
        return self._encoder.encode(event)

    def decode(self, data: bytes | None) -> E:
        if data is None:
            raise SchemaError("record has no value (tombstone)")
        try:
            return self._decoder.decode(data)
        except msgspec.ValidationError as exc:
            if "schema_version" in str(exc):
                raise SchemaError(
                    f"{exc}; this reader understands schema_version <= {SCHEMA_VERSION}"
                ) from exc
            raise SchemaError(f"invalid {self.event.__name__}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise SchemaError(f"undecodable {self.event.__name__}: {exc}") from exc
        except RecursionError as exc:  # nesting deeper than the interpreter's stack (in an unknown field too)
            raise SchemaError(f"undecodable {self.event.__name__}: nested too deeply ({exc})") from exc
        except Exception as exc:  # whatever else a hostile record triggers is a bad record, not a crash
            raise SchemaError(f"undecodable {self.event.__name__}: {type(exc).__name__}: {exc}") from exc


@functools.cache
def codec(event: type[E]) -> Codec[E]:
    """The one codec of ``event`` (built once per process)."""
    return Codec(event)
