"""The archiver on the real broker: every record of every topic archived exactly once across a
SIGKILL and a rebalance between two archiver processes, readable by partition and offset, and
what it decodes of each event (the fields users filter on)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from rollstream.archive import ArchiveStore
from rollstream.config import ArchiveConfig, Config
from rollstream.consumers.archiver.stage import check_complete
from rollstream.kafka import delete_topics, ensure_topics, topic_name
from rollstream.schemas import TOPICS, codec
from rollstream.schemas.events import RewardScored
from rollstream.testing import make_prompt, make_reward
from tests.helpers import end, kill, start_worker, wait_until_sync, write_config


async def produce(infra, records: list[tuple[str, bytes | None, bytes]]) -> set[tuple[str, int, int]]:
    """Send (registry topic, key, value) records; returns the (topic, partition, offset) of each."""
    producer = AIOKafkaProducer(bootstrap_servers=infra.kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic_name(infra, name), value, key=key) for name, key, value in records]
        metas = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return {(name, m.partition, m.offset) for (name, _, _), m in zip(records, metas)}


def batch(n: int, start: int) -> list[tuple[str, bytes | None, bytes]]:
    """A mix: rewards and prompts that decode, garbage on the actions topic and its DLQ."""
    out: list[tuple[str, bytes | None, bytes]] = []
    for i in range(start, start + n):
        group = f"g{i // 4}"
        if i % 5 == 0:
            out.append(("actions", group.encode(), b"\xc1 not msgpack %d" % i))
        elif i % 7 == 0:
            out.append(("actions.dlq", None, b"junk"))
        elif i % 3 == 0:
            out.append(("prompts", group.encode(), codec(type(p := make_prompt(group))).encode(p)))
        else:
            event = make_reward(group, i % 4, reward=float(i % 2), task_id=f"task/{i % 9}", family="fam")
            out.append(("rewards", group.encode(), codec(RewardScored).encode(event)))
    return out


def archived(store: ArchiveStore) -> list[tuple[str, int, int]]:
    found = []
    for name in {f.topic for f in store.files()}:
        table = store.read(name, columns=["offset"])
        found += [(name, p, o) for p, o in zip(table.column("partition").to_pylist(),
                                               table.column("offset").to_pylist())]
    return found


def wait_for_files(store: ArchiveStore, at_least: int, timeout_s: float = 60) -> None:
    wait_until_sync(lambda: len(store.files()) >= at_least, f"the archiver wrote {at_least} files", timeout_s)


@pytest.mark.integration
def test_archiver_exactly_once_across_sigkill_and_rebalance(config: Config, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    config = msgspec.structs.replace(config, archive=ArchiveConfig(url=str(root), flush_s=0.3, flush_records=50))
    path = write_config(config, tmp_path / "rollstream.toml")
    store = ArchiveStore(str(root))
    asyncio.run(ensure_topics(config.infra, list(TOPICS)))
    procs = []
    try:
        produced = asyncio.run(produce(config.infra, batch(300, 0)))
        first = start_worker(path, tmp_path / "a1.log", stage="archiver")
        procs.append(first)
        wait_for_files(store, 3)
        written = len(store.files())
        produced |= asyncio.run(produce(config.infra, batch(300, 300)))
        wait_for_files(store, written + 1)  # the second batch is being archived: some written, some buffered
        assert kill(first, signal.SIGKILL) == -signal.SIGKILL
        produced |= asyncio.run(produce(config.infra, batch(300, 600)))
        second = start_worker(path, tmp_path / "a2.log", stage="archiver")
        third = start_worker(path, tmp_path / "a3.log", stage="archiver")  # the group rebalances between them
        procs += [second, third]
        for i in range(6):  # records keep coming while the group rebalances, each batch once the archive grew
            written = len(store.files())
            produced |= asyncio.run(produce(config.infra, batch(100, 900 + 100 * i)))
            wait_for_files(store, written + 1)
        assert kill(second, signal.SIGTERM, timeout_s=60) == 0  # drains what it holds, commits
        produced |= asyncio.run(produce(config.infra, batch(200, 1500)))
        # The survivor takes over the partitions of the one that left (after a rebalance).
        wait_until_sync(lambda: produced <= set(archived(store)), "the remaining archiver took over", 90, 0.5)
        assert kill(third, signal.SIGTERM, timeout_s=60) == 0
        found = archived(store)
        missing = sorted(produced - set(found))
        assert not missing, (len(missing), missing[:20])
        assert len(found) == len(produced) == 1700
        assert set(found) == produced
        report = asyncio.run(check_complete(config, store))
        assert report["complete"], report
        assert report["records"] == 1700
        assert (root / "_complete.json").is_file()
        # The decoded fields of the events that decode; the others are kept, bytes and all.
        rewards = store.read("rewards")
        rows = rewards.to_pylist()
        assert rows and all(r["group_id"] and r["rollout_id"] and r["task_id"].startswith("task/") for r in rows)
        assert {r["verdict"] for r in rows} == {"pass"} and {r["reward"] for r in rows} == {0.0, 1.0}
        assert all(codec(RewardScored).decode(r["value"]).rollout.rollout_id == r["rollout_id"] for r in rows)
        junk = store.read("actions").to_pylist()
        assert junk and all(r["group_id"] is None and r["value"].startswith(b"\xc1") for r in junk)
        # A group's records are where its key hashes: reading that one partition finds them all.
        group = rows[0]["group_id"]
        [partition] = store.group_partitions("rewards", group)
        one = store.read("rewards", partitions=[partition], filters=[("group_id", "=", group)])
        assert one.num_rows == sum(r["group_id"] == group for r in rows) > 0
    finally:
        end(procs)
        asyncio.run(delete_topics(config.infra, [topic_name(config.infra, n) for n in TOPICS]
                                  + [topic_name(config.infra, n + ".dlq") for n in TOPICS]))


@pytest.mark.unit
def test_archive_reader_skips_overlapping_files(tmp_path: Path) -> None:
    """Two files holding some of the same offsets (a stalled archiver wrote after its partition
    moved on): each offset is read once, and counted once."""
    import pyarrow as pa

    from rollstream.archive import schema
    from rollstream.consumers.archiver.stage import build_tables

    store = ArchiveStore(str(tmp_path / "a"))

    def table(first: int, last: int) -> tuple[str, pa.Table]:
        records = [SimpleNamespace(offset=offset, timestamp=1_700_000_000_000, key=b"k", value=b"v%d" % offset)
                   for offset in range(first, last + 1)]
        [(hour, t)], undecoded = build_tables("rewards", records)
        assert undecoded == last - first + 1 and t.schema == schema()
        return hour, t

    for first, last in ((0, 9), (5, 14), (15, 19), (3, 7)):
        hour, t = table(first, last)
        store.write_file("rewards", 0, hour, t)
    got = store.read("rewards")
    assert got.column("offset").to_pylist() == list(range(20))
    assert got.column("value").to_pylist() == [b"v%d" % o for o in range(20)]
    assert store.counts() == {"rewards": {0: (20, 20)}}
    assert store.next_offsets("rewards") == {0: 20}
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(TOPICS))
def test_every_topic_has_decoded_fields(name: str) -> None:
    """Each registry topic's events decode into their filterable fields; garbage into None."""
    from rollstream.archive import row_fields
    from rollstream.testing import make_action

    assert row_fields(name, b"\x00garbage") is None
    assert row_fields(name + ".dlq", b"\x00garbage") is None
    samples = {"prompts": make_prompt("g1"), "actions": make_action("g1", 2), "rewards": make_reward("g1", 2)}
    if name in samples:
        row = row_fields(name, codec(type(samples[name])).encode(samples[name]))
        assert row is not None and row[0] == "g1" and row[2] == "t/0"
