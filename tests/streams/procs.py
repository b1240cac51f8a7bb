"""Helpers of the stream's process-level tests and benchmark: worker subprocesses (ended by
pid), producing rewards and reading everything on ``advantages``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from rollstream.config import Config, to_toml
from rollstream.infra import pid_alive

REPO = Path(__file__).resolve().parents[2]
READY_LINE = "Recovery]: Worker ready"  # partitions assigned, flow resumed


def write_config(config: Config, path: Path) -> Path:
    path.write_text(to_toml(config))
    return path


def start_worker(config_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """``python -m streams.advantages --config ...`` in its own session, output to ``log_path``."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "streams.advantages", "--config", str(config_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True,
        )


def ready_count(log_path: Path) -> int:
    try:
        return log_path.read_text(errors="replace").count(READY_LINE)
    except FileNotFoundError:
        return 0


async def wait_ready(proc: subprocess.Popen[bytes], log_path: Path, *, starts: int = 1, timeout_s: float = 90) -> None:
    """Wait until the log shows ``starts`` "Ready" lines (a worker appends to its log)."""
    deadline = time.monotonic() + timeout_s
    while ready_count(log_path) < starts:
        if proc.poll() is not None:
            raise AssertionError(f"worker exited with {proc.returncode}; log:\n{log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker not ready after {timeout_s}s; log:\n{log_path.read_text()[-3000:]}")
        await asyncio.sleep(0.1)


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL, timeout_s: float = 20) -> int:
    """Send ``sig`` to the worker (by pid), wait for it, return its exit code."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=10)


def end(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None and pid_alive(proc.pid):
            kill(proc)


async def read_all(bootstrap: str, topic: str, *, expect: int, timeout_s: float = 60.0,
                   idle_s: float = 2.0) -> list[tuple[int, bytes | None, bytes]]:
    """Every (partition, key, value) on ``topic``, from the start: waits until ``expect`` records arrived
    and then ``idle_s`` more without any (so extra records would be seen), or ``timeout_s``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        deadline = time.monotonic() + 10
        while not partitions and time.monotonic() < deadline:
            await consumer.force_metadata_update()
            partitions = consumer.partitions_for_topic(topic) or set()
            await asyncio.sleep(0.2)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        await consumer.seek_to_beginning()
        records: list[tuple[int, bytes | None, bytes]] = []
        deadline = time.monotonic() + timeout_s
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = [(m.partition, m.key, m.value) for msgs in batch.values() for m in msgs]
            if got:
                records.extend(got)
                last_new = time.monotonic()
            elif len(records) >= expect and time.monotonic() - last_new > idle_s:
                break
        return records
    finally:
        await consumer.stop()
