"""Small valid events for tests (every field explicit, so a schema change shows up here)."""

from __future__ import annotations

import time

from schemas import (
    ActionGenerated,
    ExecutionRecord,
    Message,
    PromptIssued,
    RewardScored,
    RewardSpec,
    Rollout,
)


def make_prompt(group_id: str = "g0", group_size: int = 4, task_id: str = "t/0") -> PromptIssued:
    return PromptIssued(
        group_id=group_id,
        task_id=task_id,
        family="t",
        messages=[Message(role="user", content="Write add(a, b).")],
        group_size=group_size,
        reward=RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3"]),
        issued_policy_version=0,
        issued_at=time.time(),
    )


def make_rollout(group_id: str = "g0", sample_index: int = 0, n_tokens: int = 4, version: int = 0) -> Rollout:
    return Rollout(
        rollout_id=f"{group_id}/{sample_index}",
        group_id=group_id,
        sample_index=sample_index,
        group_size=4,
        task_id="t/0",
        family="t",
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=list(range(10, 10 + n_tokens)),
        behaviour_logprobs=[-0.5] * n_tokens,
        policy_version_first=version,
        policy_version_last=version,
        issued_policy_version=version,
        finish_reason="stop",
    )


def make_action(group_id: str = "g0", sample_index: int = 0) -> ActionGenerated:
    return ActionGenerated(
        rollout=make_rollout(group_id, sample_index),
        completion_text="```python\ndef add(a, b):\n    return a + b\n```",
        reward=RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3"]),
        generator_id="gen-0",
        queued_s=0.01,
        generate_s=0.5,
        generated_at=time.time(),
    )


def make_reward(group_id: str = "g0", sample_index: int = 0, reward: float = 1.0) -> RewardScored:
    return RewardScored(
        rollout=make_rollout(group_id, sample_index),
        reward=reward,
        components={"tests": reward},
        execution=ExecutionRecord(sandbox_id="sb-0", exit_code=0, duration_s=0.01, error_kind="none",
                                  tests_passed=1, tests_total=1),
        executor_id="exec-0",
        scored_at=time.time(),
    )


async def read_events(infra, name: str, event: type, until=lambda got: False, timeout_s: float = 20.0) -> list:
    """The events on registry topic ``name`` from the start (no consumer group), decoded as
    ``event``, until ``until(events)`` holds or ``timeout_s`` passed (then whatever arrived)."""
    from aiokafka import AIOKafkaConsumer

    from rollstream.kafka import topic_name
    from schemas import codec

    consumer = AIOKafkaConsumer(topic_name(infra, name), bootstrap_servers=infra.kafka_bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    await consumer.start()
    events: list = []
    try:
        deadline = time.monotonic() + timeout_s
        while not until(events) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                events += [codec(event).decode(r.value) for r in records]
    finally:
        await consumer.stop()
    return events


async def read_dead_letters(infra, name: str, want: int, timeout_s: float = 20.0) -> list:
    """The DeadLetter records of registry topic ``name``'s DLQ."""
    from schemas import DeadLetter

    return await read_events(infra, f"{name}.dlq", DeadLetter, lambda got: len(got) >= want, timeout_s)
