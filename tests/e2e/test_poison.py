"""Poison input against each consuming stage, on the real broker (tests/poison.py: 20-25 kinds per
topic, from garbage bytes to schema-shaped impossible values, plus each stage's own: a continuation
for the generator, an unknown reward kind for the executor, token ids outside the vocabulary for
the learner). Each stage stays up, processes every valid record sent after the bad ones, and puts
every bad one on its topic's dead-letter queue with its bytes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from rollstream.config import (
    CheckpointConfig,
    Config,
    ExecutorConfig,
    GeneratorConfig,
    LearnerConfig,
    RLConfig,
)
from rollstream.kafka import ensure_topics, topic_name
from rollstream.schemas import (
    ActionGenerated,
    GroupAdvantaged,
    GroupFate,
    PromptIssued,
    RewardScored,
    RewardSpec,
    codec,
)
from rollstream.schemas.events import Continuation
from rollstream.testing import make_action, make_prompt, make_reward
from tests.helpers import end, group, read_dead_letters, read_events, start_worker, wait_ready, write_config
from tests.poison import poison, tolerated

pytestmark = pytest.mark.e2e

async def send_raw(config: Config, name: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=config.infra.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic_name(config.infra, name), value, key=key)
    finally:
        await producer.stop()


async def bad_then_good(config: Config, name: str, sample, extra_bad: list[bytes], good: list) -> list[bytes | None]:
    """Send every poison kind of ``sample`` (and ``extra_bad``), then the tolerated forms, then
    ``good`` (events); returns the bad values sent."""
    bad = [value for _, value in poison(sample)] + extra_bad
    key = b"poison"
    await send_raw(config, name, [(key, value) for value in bad])
    await send_raw(config, name, [(key, value) for _, value in tolerated(sample)])
    await send_raw(config, name, [(e.group_id.encode() if hasattr(e, "group_id") else e.rollout.group_id.encode(),
                                   codec(type(e)).encode(e)) for e in good])
    return bad


async def assert_dead_lettered(config: Config, name: str, bad: list[bytes | None]) -> None:
    letters = await read_dead_letters(config.infra, name, len(bad), timeout_s=60)
    assert sorted((v or b"") for v in (letter.value for letter in letters)) == sorted((v or b"") for v in bad)
    assert all(letter.reason for letter in letters)


async def test_generator_survives_poison(config: Config, tiny_model_dir: Path) -> None:
    from rollstream.consumers.generator.backends.hf import TransformersBackend
    from rollstream.consumers.generator.stage import run

    config = msgspec.structs.replace(config, generator=GeneratorConfig(
        model=str(tiny_model_dir), max_new_tokens=4, max_batch_prompts=4, batch_wait_ms=10, max_new_tokens_limit=8))
    await ensure_topics(config.infra, ["prompts", "actions"])
    continuation = msgspec.structs.replace(make_prompt("cont", 1), continuation=Continuation(
        sample_index=0, turn=2, messages=[], prompt_token_ids=[1], completion_token_ids=[], generated_mask=[],
        behaviour_logprobs=[], observation="failed"))
    impossible = msgspec.structs.replace(make_prompt("impossible", 2), sampling=msgspec.convert(
        {"top_k": 2**64 - 1, "max_new_tokens": 131072, "temperature": 10.0}, type(make_prompt().sampling)))
    good = [make_prompt("good1", 2), make_prompt("good2", 2), impossible]
    bad = await bad_then_good(config, "prompts", make_prompt("p", 2), [codec(PromptIssued).encode(continuation)], good)
    stop = asyncio.Event()
    stage = asyncio.create_task(run(config, backend=TransformersBackend.load(str(tiny_model_dir)), stop=stop))
    try:
        # The tolerated form of the sample (group "p") is generated too.
        want = {"good1", "good2", "impossible", "p"}
        actions = await read_events(config.infra, "actions", ActionGenerated,
                                    lambda got: {a.rollout.group_id for a in got} >= want, timeout_s=90)
        assert {a.rollout.group_id for a in actions} == want and not stage.done()
        assert all(len(a.rollout.completion_token_ids) <= 8 for a in actions)
        await assert_dead_lettered(config, "prompts", bad)
    finally:
        stop.set()
        await asyncio.wait_for(stage, 60)


async def test_executor_survives_poison(config: Config, sandbox_image: str, owner: str) -> None:
    from rollstream.consumers.executor.stage import run

    config = msgspec.structs.replace(config, executor=ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1,
                                                                     concurrency=2))
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    unknown_kind = msgspec.structs.replace(make_action("k", 0), reward=RewardSpec(kind="no_such_kind"))
    good = [make_action("good", i) for i in range(2)]
    bad = await bad_then_good(config, "actions", make_action("a", 0), [codec(ActionGenerated).encode(unknown_kind)],
                              good)
    stop = asyncio.Event()
    stage = asyncio.create_task(run(config, stop=stop))
    try:
        want = {"good/0", "good/1", "a/0"}
        rewards = await read_events(config.infra, "rewards", RewardScored,
                                    lambda got: {r.rollout.rollout_id for r in got} >= want, timeout_s=90)
        assert {r.rollout.rollout_id for r in rewards} == want and not stage.done()
        assert all(r.reward == 1.0 for r in rewards if r.rollout.group_id == "good")
        await assert_dead_lettered(config, "actions", bad)
    finally:
        stop.set()
        await asyncio.wait_for(stage, 60)


async def test_stream_survives_poison(config: Config, tmp_path: Path) -> None:
    await ensure_topics(config.infra, ["rewards", "advantages"])
    good = [make_reward("good", i, reward=float(i % 2), group_size=2) for i in range(2)]
    bad = await bad_then_good(config, "rewards", make_reward("r", 0, group_size=1), [], good)
    path = write_config(config, tmp_path / "rollstream.toml")
    log = tmp_path / "stream.log"
    proc = start_worker(path, log)
    try:
        await wait_ready(proc, log)
        groups = await read_events(config.infra, "advantages", GroupAdvantaged,
                                   lambda got: {g.group_id for g in got} >= {"good", "r"}, timeout_s=90)
        assert {g.group_id for g in groups} == {"good", "r"} and proc.poll() is None
        await assert_dead_lettered(config, "rewards", bad)
    finally:
        end([proc])


async def test_learner_survives_poison(config: Config, learner_model_dir: str, tmp_path: Path) -> None:
    from rollstream.learner import train

    config = msgspec.structs.replace(
        config, rl=RLConfig(groups_per_step=2, max_staleness=100),
        learner=LearnerConfig(model=learner_model_dir, micro_batch=4, max_steps=1,
                              checkpoint=CheckpointConfig(every=0, dir=str(tmp_path / "ckpt"))))
    await ensure_topics(config.infra, ["advantages", "policy", "fates"])
    sample = group("s", [1.0, -1.0])
    outside = group("outside", [1.0, -1.0])
    rollout = msgspec.structs.replace(outside.rollouts[0].rollout, prompt_token_ids=[1, 2**31 - 1])
    outside = msgspec.structs.replace(outside, rollouts=[msgspec.structs.replace(outside.rollouts[0], rollout=rollout),
                                                         outside.rollouts[1]])
    good = [group("good", [1.0, -1.0], seed=3)]
    bad = await bad_then_good(config, "advantages", sample, [codec(GroupAdvantaged).encode(outside)], good)
    started = time.monotonic()
    await asyncio.wait_for(train.run(config), 300)  # one step: the tolerated "s" and "good"
    fates = await read_events(config.infra, "fates", GroupFate, lambda got: len(got) >= 3)
    assert sorted((f.group_id, f.fate) for f in fates) == [("good", "trained"), ("outside", "invalid"),
                                                           ("s", "trained")], time.monotonic() - started
    await assert_dead_lettered(config, "advantages", bad)
