"""Kafka plumbing against the real local broker: codecs, dead-lettering, commits, group splits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from rollstream.config import InfraConfig
from rollstream.kafka import BATCH_API_MIN_RECORDS, EventConsumer, EventProducer, ensure_topics, topic_name
from rollstream.metrics import StageMetrics
from rollstream.schemas import codec
from rollstream.testing import make_prompt, make_reward
from tests.helpers import read_counter, read_dead_letters

pytestmark = pytest.mark.integration

async def _drain(consumer: EventConsumer, want: int, timeout_s: float = 20.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for delivery in await consumer.getmany(timeout_s=0.5):
            got.append(delivery)
            consumer.done(delivery)
    return got


async def test_round_trip_keyed_by_group(infra_config: InfraConfig) -> None:
    await ensure_topics(infra_config, ["prompts"])
    async with EventProducer(infra_config, client_id="t") as producer:
        events = [make_prompt(group_id=f"g{i}") for i in range(20)]
        await producer.send_many([("prompts", e) for e in events])
        async with EventConsumer(infra_config, "prompts", group_id="g", producer=producer, stage="t") as consumer:
            got = await _drain(consumer, 20)
    assert sorted(d.event.group_id for d in got) == sorted(e.group_id for e in events)
    assert all(d.key == d.event.group_id.encode() for d in got)
    # Same key, same partition.
    by_group = {d.event.group_id: d.partition for d in got}
    assert len(set(by_group.values())) > 1


async def test_send_many_batches_keep_send_partitions_and_order(infra_config: InfraConfig) -> None:
    """Many events take the batch path (BATCH_API_MIN_RECORDS), with batches small enough to
    fill up: each key lands where ``send`` puts it, in order within its partition."""
    small = msgspec.structs.replace(infra_config, max_batch_bytes=4096)
    await ensure_topics(small, ["rewards"])
    events = [make_reward(group_id=f"g{i % 7}", sample_index=i) for i in range(5 * BATCH_API_MIN_RECORDS)]
    async with EventProducer(small, client_id="t") as producer:
        await producer.send_many([("rewards", e) for e in events])
        expected = {}
        for gid in {e.rollout.group_id for e in events}:  # where aiokafka's own send() puts each key
            meta = await (await producer.raw.send(topic_name(small, "rewards"), b"probe", key=gid.encode()))
            expected[gid] = meta.partition
        async with EventConsumer(small, "rewards", group_id="batches", producer=producer, stage="t") as consumer:
            got = await _drain(consumer, len(events))
    assert len(got) == len(events)
    assert all(d.partition == expected[d.event.rollout.group_id] for d in got)
    for gid in expected:
        mine = [d for d in got if d.event.rollout.group_id == gid]
        assert [d.event.rollout.sample_index for d in sorted(mine, key=lambda d: d.offset)] == \
            [e.rollout.sample_index for e in events if e.rollout.group_id == gid]
    assert len({d.partition for d in got}) > 1


async def test_bad_records_go_to_dlq_and_the_next_is_processed(infra_config: InfraConfig) -> None:
    await ensure_topics(infra_config, ["prompts"])
    metrics = StageMetrics("t")
    bad_version = msgspec.msgpack.encode({**msgspec.to_builtins(make_prompt(group_id="v")), "schema_version": 99})
    out_of_range = msgspec.msgpack.encode(
        {**msgspec.to_builtins(make_prompt(group_id="r")), "group_size": 0}
    )
    wrong_type = codec(type(make_reward())).encode(make_reward())
    bad = {
        b"random": os.urandom(64),
        b"wrong-type": wrong_type,
        b"out-of-range": out_of_range,
        b"version": bad_version,
    }
    topic = topic_name(infra_config, "prompts")
    async with EventProducer(infra_config, client_id="t", metrics=metrics) as producer:
        for key, value in bad.items():
            await (await producer.raw.send(topic, value, key=key, partition=0))
        good = make_prompt(group_id="good")
        await (await producer.raw.send(topic, codec(type(good)).encode(good), key=b"good", partition=0))
        async with EventConsumer(
            infra_config, "prompts", group_id="g", producer=producer, stage="t", metrics=metrics
        ) as consumer:
            got = await _drain(consumer, 1)
            assert [d.event.group_id for d in got] == ["good"]
            assert consumer.safe_offsets()[0] == 5  # bad records count as done: nothing blocks the commit

    letters = await read_dead_letters(infra_config, "prompts", 4, timeout_s=15)
    by_key = {letter.key: letter for letter in letters}
    assert set(by_key) == set(bad)
    for key, value in bad.items():
        assert by_key[key].value == value  # the original bytes, byte for byte
        assert by_key[key].topic == topic and by_key[key].partition == 0
    assert "undecodable" in by_key[b"random"].reason or "invalid" in by_key[b"random"].reason
    assert "invalid PromptIssued" in by_key[b"wrong-type"].reason
    assert "group_size" in by_key[b"out-of-range"].reason
    assert "schema_version" in by_key[b"version"].reason
    assert sorted(letter.offset for letter in letters) == [0, 1, 2, 3]
    dead = sum(
        read_counter(metrics, "dead_lettered", stage="t", topic="prompts", reason=kind)
        for kind in ("undecodable", "invalid", "schema_version", "rejected")
    )
    assert dead == 4


async def test_commit_never_passes_unfinished_work(infra_config: InfraConfig) -> None:
    await ensure_topics(infra_config, ["prompts"])
    topic = topic_name(infra_config, "prompts")
    async with EventProducer(infra_config, client_id="t") as producer:
        for i in range(5):
            e = make_prompt(group_id=f"o{i}")
            await (await producer.raw.send(topic, codec(type(e)).encode(e), key=b"k", partition=1))
        async with EventConsumer(infra_config, "prompts", group_id="g", producer=producer, stage="t") as consumer:
            got: list = []
            while len(got) < 5:
                got += await consumer.getmany(timeout_s=0.5)
            got.sort(key=lambda d: d.offset)
            for d in (got[0], got[2], got[4]):  # finish out of order
                consumer.done(d)
            assert consumer.safe_offsets()[1] == 1
            consumer.done(got[1])
            assert consumer.safe_offsets()[1] == 3
            await consumer.commit()
        # A new member of the group resumes at the first unfinished record.
        async with EventConsumer(infra_config, "prompts", group_id="g", producer=producer, stage="t") as again:
            redelivered = await _drain(again, 2, timeout_s=10)
    assert [d.offset for d in redelivered] == [3, 4]


WORKER = Path(__file__).with_name("kafka_worker.py")


def _start_worker(infra: InfraConfig, out: Path, name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    return subprocess.Popen(
        [sys.executable, str(WORKER), msgspec.json.encode(infra).decode(), str(out), name],
        env=env, stdout=subprocess.DEVNULL, stderr=open(out.with_suffix(f".{name}.log"), "wb"),
    )


def _ids(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


async def test_group_split_and_sigkill_loses_nothing(infra_config: InfraConfig, tmp_path: Path) -> None:
    """Two consumers split the partitions; SIGKILL one mid-stream, restart it: every id is
    processed, and only records that were not committed are processed twice."""
    await ensure_topics(infra_config, ["prompts"])
    total = 400
    async with EventProducer(infra_config, client_id="t") as producer:
        await producer.send_many([("prompts", make_prompt(group_id=f"id{i:04d}")) for i in range(total // 2)])
    out_a, out_b = tmp_path / "a.ids", tmp_path / "b.ids"
    a = _start_worker(infra_config, out_a, "a")
    b = _start_worker(infra_config, out_b, "b")
    procs = [a, b]
    try:
        _wait(lambda: len(_ids(out_a)) > 0 and len(_ids(out_b)) > 0, 60, "both workers to process records")
        async with EventProducer(infra_config, client_id="t") as producer:
            await producer.send_many(
                [("prompts", make_prompt(group_id=f"id{i:04d}")) for i in range(total // 2, total)]
            )
        a.send_signal(signal.SIGKILL)
        a.wait()
        a2 = _start_worker(infra_config, tmp_path / "a2.ids", "a2")
        procs.append(a2)
        _wait(lambda: len(set(_ids(out_a) + _ids(out_b) + _ids(tmp_path / "a2.ids"))) >= total, 90,
              "every id to be processed")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    ids = _ids(out_a) + _ids(out_b) + _ids(tmp_path / "a2.ids")
    assert set(ids) == {f"id{i:04d}" for i in range(total)}
    # Each worker commits after every batch, so only the killed worker's last uncommitted
    # batch can be seen twice; it is bounded by the worker's batch size (25).
    duplicates = len(ids) - len(set(ids))
    assert duplicates <= 25, duplicates
    b_ids = set(_ids(out_b))
    assert b_ids and b_ids != set(ids)  # b did not take everything: the partitions were split
