"""Two stream workers in one Faust group split the rewards partitions; no group is split."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path

import msgspec
import pytest

from rollstream.config import Config, RLConfig, StreamConfig
from rollstream.infra import free_port
from rollstream.kafka import EventProducer, ensure_topics, topic_name
from rollstream.schemas import GroupAdvantaged, codec
from rollstream.testing import make_reward
from tests.helpers import end, kill, read_all, scrape_metrics, start_worker, wait_ready, write_config

pytestmark = pytest.mark.integration
GROUP_SIZE = 4
PARTITIONS = 4


def owned(samples: dict[str, float]) -> set[int]:
    return {p for p in range(PARTITIONS) if samples.get(f'rollstream_stream_owned_partition{{partition="{p}"}}') == 1.0}


async def wait_for_split(ports: list[int], timeout_s: float = 90) -> list[set[int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            shares = [owned(scrape_metrics(port)) for port in ports]
        except OSError:
            shares = []
        if shares and all(shares) and sorted(p for s in shares for p in s) == list(range(PARTITIONS)):
            return shares
        assert time.monotonic() < deadline, f"partitions not split between the workers: {shares}"
        await asyncio.sleep(0.5)


async def test_two_workers_split_partitions_and_never_split_a_group(config: Config, broker: str, tmp_path: Path):
    config = msgspec.structs.replace(
        config, rl=RLConfig(group_size=GROUP_SIZE),
        stream=StreamConfig(filter_zero_variance=False, group_deadline_s=600, batch_within_s=0.02),
    )
    assert config.infra.partitions == PARTITIONS
    await ensure_topics(config.infra, ["rewards", "advantages"])
    ports = [free_port(), free_port()]
    procs = []
    try:
        for i, port in enumerate(ports):
            worker_config = msgspec.structs.replace(
                config, stream=msgspec.structs.replace(config.stream, metrics_port=port))
            path = write_config(worker_config, tmp_path / f"worker{i}.toml")
            log = tmp_path / f"worker{i}.log"
            procs.append(start_worker(path, log))
            await wait_ready(procs[-1], log)
        shares = await wait_for_split(ports)

        rng = random.Random(7)
        n_groups = 200
        order = [(g, i) for g in range(n_groups) for i in range(GROUP_SIZE)]
        rng.shuffle(order)  # a group's rewards arrive far apart, between other groups'
        async with EventProducer(config.infra, client_id="scale-test") as producer:
            await producer.send_many([
                ("rewards", make_reward(f"s{g:03d}", i, float(rng.randint(0, 1)) + i, group_size=GROUP_SIZE))
                for g, i in order
            ])
        records = await read_all(broker, topic_name(config.infra, "advantages"), expect=n_groups, timeout_s=90)

        events = [codec(GroupAdvantaged).decode(value) for _, _, value in records]
        # keyed by group_id, each group's rewards sit in one partition, and each partition has
        # one owner (the shares above are disjoint): so one worker saw the whole group
        rewards = await read_all(broker, topic_name(config.infra, "rewards"), expect=n_groups * GROUP_SIZE,
                                 idle_s=0.5)
        partitions_of: dict[bytes, set[int]] = {}
        for partition, key, _ in rewards:
            partitions_of.setdefault(key, set()).add(partition)
        assert all(len(p) == 1 for p in partitions_of.values())
        assert sorted({e.group_id for e in events}) == [f"s{g:03d}" for g in range(n_groups)]
        for event in events:  # each group whole: all G rollouts, from one worker
            assert event.complete and [r.rollout.sample_index for r in event.rollouts] == list(range(GROUP_SIZE))
        per_worker = [scrape_metrics(port) for port in ports]
        consumed = [m.get('rollstream_records_in_total{stage="stream",topic="rewards"}', 0.0) for m in per_worker]
        emitted = [sum(v for k, v in m.items() if k.startswith("rollstream_stream_groups_emitted_total")) for m in per_worker]
        assert all(c > 0 for c in consumed), consumed  # both workers did work
        assert sum(emitted) >= n_groups
        assert len(records) == n_groups, "a group was emitted twice without any crash"
        print(f"\npartitions {shares}; rewards consumed per worker {consumed}; groups emitted {emitted}")
        for proc in procs:
            assert kill(proc, signal.SIGTERM) == 0
    finally:
        end(procs)
