"""The intake guard (rollstream/guard.py) on the real Redis and, through the executor stage, on the
real broker: duplicates of acknowledged work are skipped unless replayed, a record that crashed
three owners is dead-lettered with its bytes by the fourth, which goes on with the valid records
behind it (a valid record that shared the first crash is counted once and then run alone, so it is
never taken for the poison), and Redis being unreachable admits everything."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from rollstream.config import Config, ExecutorConfig, InfraConfig, SimExecutorConfig
from rollstream.consumers.executor.sim_sandbox import SimSandbox
from rollstream.consumers.executor.stage import run
from rollstream.guard import DUPLICATE, NEW, POISON, REPLAY_HEADER, SUSPECT, IntakeGuard
from rollstream.kafka import EventProducer, ensure_topics, topic_name
from rollstream.metrics import StageMetrics
from rollstream.redis import connect
from rollstream.schemas import DeadLetter, codec
from rollstream.schemas.events import ActionGenerated, RewardScored, RewardSpec
from rollstream.testing import make_action, make_rollout
from tests.helpers import read_counter, read_events, wait_until

GOOD = "def add(a, b):\n    return a + b"


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    headers: tuple = ()


@pytest.mark.integration
async def test_duplicates_poison_replay_and_release(infra_config: InfraConfig, redis_url: str) -> None:
    redis = connect(redis_url)
    metrics = StageMetrics("executor")
    guard = IntakeGuard(redis, infra_config, "executor", metrics)
    try:
        a, b = Record("t", 0, 1), Record("t", 0, 2)
        assert await guard.admit([a, b], ["g/0#1", "g/1#1"]) == [NEW, NEW]
        guard.finished(a, "g/0#1")  # a's outputs acknowledged; b's owner dies holding it
        await guard.flush()
        again = Record("t", 1, 7)  # the same rollout turn, produced twice
        replayed = Record("t", 1, 8, headers=((REPLAY_HEADER, b"1"),))
        assert await guard.admit([again, replayed], ["g/0#1", "g/0#1"]) == [DUPLICATE, NEW]
        assert await guard.admit([replayed], ["g/0#1"]) == [SUSPECT]  # a replay's attempts count like any
        assert await guard.admit([b], ["g/1#1"]) == [SUSPECT]  # second owner: run it alone
        await guard.start_suspect(b)
        assert await guard.admit([b], ["g/1#1"]) == [SUSPECT]  # third owner
        await guard.start_suspect(b)
        assert await guard.admit([b], ["g/1#1"]) == [POISON]  # the fourth gives up on it
        guard.released(b)  # dead-lettered: its counter goes
        await guard.flush()
        assert await guard.admit([b], ["g/1#1"]) == [NEW]
        # a record admitted and then dropped without failing does not count as an attempt
        c = Record("t", 2, 3)
        for _ in range(5):
            assert await guard.admit([c], ["g/2#1"]) == [NEW]
            guard.released(c)
            await guard.flush()
    finally:
        await redis.aclose()
    off = msgspec.structs.replace(infra_config, poison_attempts=0, dedupe_ttl_s=0)
    assert await IntakeGuard(None, off, "executor").admit([a, b], ["g/0#1", "g/1#1"]) == [NEW, NEW]  # no Redis used


@pytest.mark.unit
async def test_unreachable_redis_admits_everything_and_counts_it() -> None:
    redis = connect("redis://127.0.0.1:1/0", retries=0)  # nothing listens on port 1
    metrics = StageMetrics("generator")
    guard = IntakeGuard(redis, InfraConfig(key_prefix="test:unreachable:"), "generator", metrics)
    try:
        records = [Record("t", 0, i) for i in range(3)]
        assert await guard.admit(records, ["a", "b", "c"]) == [NEW] * 3
        guard.finished(records[0], "a")
        await guard.flush()  # no exception
    finally:
        await redis.aclose()
    assert read_counter(metrics, "intake_guard_errors", stage="generator") == 2


def skips(caplog: pytest.LogCaptureFixture) -> int:
    """Records the intake guard skipped as already done, as its log says."""
    return sum("was already done" in r.getMessage() for r in caplog.records if r.name == "rollstream.guard")


class CrashingSandbox(SimSandbox):
    """The sim sandbox, except that code mentioning CRASH takes the executor down with it (a
    stand-in for a bug that some input triggers in a stage: the guard must not care why)."""

    async def execute(self, job):
        if "CRASH" in job.code:
            raise RuntimeError("this input crashes the executor")
        return await super().execute(job)


def action(group: str, index: int, code: str) -> ActionGenerated:
    return msgspec.structs.replace(
        make_action(group, index), rollout=make_rollout(group, index), completion_text=f"```python\n{code}\n```",
        reward=RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3"]))


@pytest.mark.integration
async def test_poison_action_is_dead_lettered_by_the_fourth_owner_and_duplicates_are_skipped(
    config: Config, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rollstream.guard")
    config = msgspec.structs.replace(config, executor=ExecutorConfig(backend=SimExecutorConfig(), concurrency=1, pool_size=1))
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    # one group: one partition, the poison first, the valid actions behind it
    actions = [action("p", 0, "CRASH = 1"), action("p", 1, GOOD), action("p", 2, "def add(a, b):\n    return 0")]
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("actions", a) for a in actions])
    sandbox = CrashingSandbox(config, [GOOD])
    for owner in range(3):  # each owner takes the poison and crashes
        with pytest.raises(BaseException) as crashed:
            await asyncio.wait_for(run(config, backend=sandbox, stop=asyncio.Event()), 60)
        assert "crashes the executor" in repr(crashed.value.exceptions if hasattr(crashed.value, "exceptions")
                                              else crashed.value), owner
    stop = asyncio.Event()
    stage = asyncio.create_task(run(config, backend=sandbox, stop=stop))
    try:
        before = await read_events(config.infra, "rewards", RewardScored,
                                   lambda got: {"p/1", "p/2"} <= {r.rollout.rollout_id for r in got}, 60)
        letters = await read_events(config.infra, "actions.dlq", DeadLetter, lambda got: len(got) >= 1, 30)
        assert not stage.done()
        # a duplicate of an acknowledged action is skipped; the same with the replay header is run again
        duplicate = codec(ActionGenerated).encode(actions[1])
        skipped = skips(caplog)
        raw = AIOKafkaProducer(bootstrap_servers=config.infra.kafka_bootstrap)
        await raw.start()
        try:
            full = topic_name(config.infra, "actions")
            await raw.send_and_wait(full, duplicate, key=b"p")
            await raw.send_and_wait(full, duplicate, key=b"p", headers=[(REPLAY_HEADER, b"1")])
        finally:
            await raw.stop()
        await wait_until(lambda: skips(caplog) > skipped, "the duplicate skipped (the guard logs it)", 60)
        rewards = await read_events(config.infra, "rewards", RewardScored, lambda got: len(got) > len(before), 60)
    finally:
        stop.set()
        await asyncio.wait_for(stage, 60)
    # p/1 may have been scored before the first crash too (at-least-once; downstream dedupes)
    assert {r.rollout.rollout_id: r.reward for r in before} == {"p/1": 1.0, "p/2": 0.0}
    assert len(rewards) == len(before) + 1 and rewards[-1].rollout.rollout_id == "p/1"  # only the replay
    assert len(letters) == 1 and letters[0].reason.startswith("poison:")
    assert codec(ActionGenerated).decode(letters[0].value) == actions[0]  # its bytes, as produced


@pytest.mark.integration
async def test_generator_skips_a_group_it_already_generated_unless_replayed(
    config: Config, tiny_model_dir, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rollstream.guard")
    from rollstream.config import SimGeneratorConfig
    from rollstream.consumers.generator.stage import run as run_generator
    from rollstream.schemas.events import PromptIssued
    from rollstream.testing import make_prompt

    config = msgspec.structs.replace(config, generator=msgspec.structs.replace(
        config.generator, backend=SimGeneratorConfig(), model=str(tiny_model_dir)))
    await ensure_topics(config.infra, ["prompts", "actions"])
    prompt = make_prompt("dup", group_size=2)
    stop = asyncio.Event()
    stage = asyncio.create_task(run_generator(config, stop=stop))
    try:
        async with EventProducer(config.infra, client_id="test") as producer:
            await producer.send("prompts", prompt)
            first = await read_events(config.infra, "actions", ActionGenerated, lambda got: len(got) >= 2, 60)
            skipped = skips(caplog)
            await producer.send("prompts", prompt)  # a redelivery of the same group (a sampler's retry, say)
        raw = AIOKafkaProducer(bootstrap_servers=config.infra.kafka_bootstrap)
        await raw.start()
        try:
            await raw.send_and_wait(topic_name(config.infra, "prompts"), codec(PromptIssued).encode(prompt),
                                    key=b"dup", headers=[(REPLAY_HEADER, b"1")])
        finally:
            await raw.stop()
        await wait_until(lambda: skips(caplog) > skipped, "the redelivered group skipped (the guard logs it)", 60)
        actions = await read_events(config.infra, "actions", ActionGenerated, lambda got: len(got) >= 4, 60)
    finally:
        stop.set()
        await asyncio.wait_for(stage, 60)
    assert len(first) == 2
    assert sorted(a.rollout.rollout_id for a in actions) == ["dup/0", "dup/0", "dup/1", "dup/1"]  # once + the replay
