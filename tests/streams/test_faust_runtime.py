"""The Faust adapter (streams/faust_runtime.py) with a probe stage in a worker process, against
the real broker: what the stage is handed, and what Faust may ack and commit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from rollstream.config import Config, InfraConfig, StreamConfig
from rollstream.infra import Endpoints
from rollstream.kafka import ensure_topics, topic_name
from rollstream.streams.faust_runtime import EXIT_ON_ERROR, faust_app, raw_topic
from tests.helpers import REPO, end, kill, write_config

BATCH_MAX = 40


@pytest.mark.unit
def test_raw_topic_passes_bytes_through(tmp_path: Path) -> None:
    """Undecodable values must reach the stage as they are, to be dead-lettered."""
    app = faust_app("schema-test", Config(infra=InfraConfig(state_dir=str(tmp_path))),
                    Endpoints("127.0.0.1:1", "redis://127.0.0.1:6379/0"), str(tmp_path))
    schema = raw_topic(app, "rewards").schema
    for key, value in [(b"g1", b"\xc1 not msgpack"), (None, None)]:
        message = SimpleNamespace(key=key, value=value)
        assert schema.loads_key(app, message) is key  # type: ignore[arg-type]
        assert schema.loads_value(app, message) is value  # type: ignore[arg-type]


def start_probe(config_path: Path, out: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.streams.faust_probe", "--config", str(config_path), "--out", str(out), *extra],
            stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True,
        )


def calls(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def handed(out: Path) -> list[tuple]:
    return [tuple(r) for c in calls(out) if "batch" in c for r in c["batch"]]


async def produce(bootstrap: str, name: str, records: list[tuple[bytes, bytes | None]]) -> set[tuple]:
    """Produce ``records`` (key, value); return them as the probe writes them, with positions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        futures = [await producer.send(name, value, key=key) for key, value in records]
        metadata = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return {(name, m.partition, m.offset, key.hex(), value and value.hex())
            for (key, value), m in zip(records, metadata, strict=True)}


@pytest.mark.unit
@pytest.mark.parametrize("wait_ms", [100, 7])
async def test_stream_consumer_fetch_wait_is_the_infra_setting(tmp_path: Path, wait_ms: int) -> None:
    """Faust fixes its consumer's fetch wait at 1500 ms; a broker that holds an empty fetch that
    long would add it to every group's way through the stream."""
    config = Config(infra=InfraConfig(state_dir=str(tmp_path), fetch_max_wait_ms=wait_ms))
    app = faust_app("fetch-wait-test", config, Endpoints("127.0.0.1:1", "redis://127.0.0.1:6379/0"), str(tmp_path))
    consumer = app.consumer._thread._create_worker_consumer(app.transport)  # what the worker starts
    assert consumer._fetch_max_wait_ms == wait_ms
    assert consumer._group_id == "fetch-wait-test"  # still Faust's own worker consumer otherwise
    await consumer.stop()  # never started: only its client to close


@pytest.mark.integration
async def test_a_failed_batch_is_never_acked_and_batches_sweeps_and_stop_keep_their_promises(
    config: Config, broker: str, tmp_path: Path
) -> None:
    config = msgspec.structs.replace(
        config, stream=StreamConfig(batch_max=BATCH_MAX, batch_within_s=0.05, sweep_interval_s=0.05))
    await ensure_topics(config.infra, ["rewards"])
    records = [(f"g{i % 50}".encode(), f"reward {i}".encode()) for i in range(200)]
    records += [(b"bad", b"\xc1 not msgpack"), (b"tombstone", None)]
    produced = await produce(broker, topic_name(config.infra, "rewards"), records)
    config_path = write_config(config, tmp_path / "probe.toml")
    procs = []
    try:
        # 1. The stage raises on its first batch: the worker exits at once, before Faust can ack.
        first_out = tmp_path / "first.jsonl"
        procs.append(start_probe(config_path, first_out, tmp_path / "first.log", "--fail-first-batch"))
        assert procs[-1].wait(timeout=60) == EXIT_ON_ERROR, (tmp_path / "first.log").read_text()[-3000:]
        failed = handed(first_out)
        assert 0 < len(failed) <= BATCH_MAX

        # 2. The next member of the group is handed everything again, that batch included,
        # byte for byte (undecodable values and tombstones too), in batches of <= batch_max.
        out = tmp_path / "second.jsonl"
        procs.append(start_probe(config_path, out, tmp_path / "second.log"))
        deadline = time.monotonic() + 120
        while set(handed(out)) != produced:
            assert procs[-1].poll() is None, (tmp_path / "second.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"handed {len(set(handed(out)))} of {len(produced)} records"
            await asyncio.sleep(0.2)
        assert set(failed) <= produced
        seen = calls(first_out) + calls(out)
        assert all(len(c["batch"]) <= BATCH_MAX for c in seen if "batch" in c)
        assert [1 for c in seen if "overlap" in c] == [], "the runtime called the stage while a call was running"
        assert [0, 1, 2, 3] in [c["sweep"] for c in seen if "sweep" in c]  # the partitions it owns

        # 3. SIGTERM: stop between calls and exit 0 (Faust's own shutdown is not used).
        assert kill(procs[-1], signal.SIGTERM) == 0
        assert "stream worker stopped" in (tmp_path / "second.log").read_text()
    finally:
        end(procs)
