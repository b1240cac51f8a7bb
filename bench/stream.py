"""Throughput of the advantage stream, side by side with its floors, in one run.

Starts a local broker (Tansu, by pid) and uses the Redis at --redis (its own key prefix,
deleted afterwards). Pre-loads N rewards (groups of G) on ``rewards`` and waits for every
ack before anything is timed, so no producer competes for the CPUs while a side reads. Then
it measures, one after the other, on the same events:

* ``bare``:   a Faust agent that only reads them (``async for event in stream``): Faust's
  floor. Its app comes from the stage's own ``streams.faust_runtime.faust_app`` (same fetch
  size, stream buffer, schema, sensor, GC tuning, log level info), so both sides of
  ``stream_ratio`` run Faust with the same settings;
* ``stream``: one ``rollstream stream`` worker (Redis store, advantages, acks),
  observed from outside, on ``advantages``;
* ``plain``:  a plain aiokafka loop: consume, decode, re-encode, produce, await acks.

Timing. ``bare`` and ``stream`` both run from their worker's "Worker ready" log line
(partitions assigned; the start-up before it is excluded) until their last event is done
(bare: the last event read; stream: the last group seen on ``advantages``, which also counts
its produce and the observer's fetch), over all N*G events. Timing the stream only from its
first output batch instead would flatter it: by then Faust has already taken in up to a
buffer's worth of the following events (that figure is in the JSON as
``stream_steady_rewards_per_s``, next to the bare reader's own first-to-last-event rate).
``plain`` runs from its first to its last produced batch. The JSON also has the worker's CPU
time per reward (``cpu_ratio`` = bare / stream CPU per reward), which depends less on other
load on the machine than the wall-clock rates.

    python bench/stream.py --quick --json OUT

Last line: ``stream_ratio`` (stream / bare; target >= 0.6), ``rewards_per_s`` (stream,
one worker; target >= 4000), ``plain_ratio`` (stream / plain, for the record).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.vs_trl_probe import process_cpu_s
from rollstream.config import Config, InfraConfig, RLConfig, StreamConfig
from rollstream.config_load import load_config
from rollstream.infra import free_port, start_broker, stop_pid
from rollstream.lifecycle import tune_gc

REPO = Path(__file__).resolve().parents[1]


def bench_config(bootstrap: str, redis_url: str, state_dir: str, group_size: int, within_s: float) -> Config:
    run = f"{os.getpid()}{random.randrange(1 << 20):05x}"
    return Config(
        infra=InfraConfig(kafka_bootstrap=bootstrap, redis_url=redis_url, topic_prefix=f"bench{run}.",
                          key_prefix=f"bench:{run}:", state_dir=state_dir, partitions=4),
        rl=RLConfig(group_size=group_size),
        stream=StreamConfig(filter_zero_variance=False, group_deadline_s=600, batch_within_s=within_s),
    )


async def preload(config: Config, n_groups: int, group_size: int, tokens: int) -> int:
    from rollstream.kafka import EventProducer, ensure_topics
    from rollstream.testing import make_reward

    await ensure_topics(config.infra, ["rewards", "advantages"])
    rng = random.Random(0)
    async with EventProducer(config.infra, client_id="bench-preload") as producer:
        for start in range(0, n_groups, 500):
            await producer.send_many([
                ("rewards", make_reward(f"g{g}", i, float(rng.randint(0, 1)), group_size=group_size,
                                        completion_tokens=tokens))
                for g in range(start, min(n_groups, start + 500)) for i in range(group_size)
            ])
    return n_groups * group_size


def run_bare(config_path: str, n_events: int, out: str) -> None:
    """Subprocess role: a Faust agent that only counts events; writes its rate and exits.

    Its app is built by the stage's own ``faust_app`` (same fetch size, stream buffer, schema,
    monitor, log level, GC tuning), so that it is Faust's floor under the stage's settings."""
    import faust

    from rollstream.infra import resolve_endpoints
    from rollstream.streams.faust_runtime import faust_app, raw_topic

    config = load_config(config_path)
    app = faust_app(f"{config.infra.topic_prefix}bare", config, resolve_endpoints(config), tempfile.mkdtemp())
    topic = raw_topic(app, f"{config.infra.topic_prefix}rewards")
    seen = {"n": 0, "t0": 0.0, "c0": 0.0}

    async def bare(stream):
        async for _ in stream:
            seen["n"] += 1
            if seen["n"] == 1:
                seen["t0"], seen["c0"] = time.perf_counter(), time.process_time()
            if seen["n"] >= n_events:
                elapsed = time.perf_counter() - seen["t0"]
                cpu = time.process_time() - seen["c0"]
                Path(out).write_text(json.dumps({"end": time.time(), "steady_rate": (n_events - 1) / elapsed,
                                                 "cpu_us": 1e6 * cpu / (n_events - 1)}))
                os._exit(0)

    app.agent(topic, name="bare")(bare)
    tune_gc()  # the same process tuning as the stream worker
    faust.Worker(app, loglevel="info", quiet=True, redirect_stdouts=False).execute_from_commandline()


def start_stream_worker(config: Config, log: Path) -> subprocess.Popen[bytes]:
    from rollstream.config_load import to_toml

    config_path = log.with_suffix(".toml")
    config_path.write_text(to_toml(config))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "rollstream.cli", "stream", "--config", str(config_path)],
                                stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)


_LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def ready_time(log: Path) -> float | None:
    """Unix time of the first "Worker ready" line of a Faust worker's log (ms resolution)."""
    from rollstream.streams.faust_runtime import READY_LOG_LINE

    for line in log.read_text(errors="replace").splitlines():
        if READY_LOG_LINE in line and (found := _LOG_TIME.search(line)):
            return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


@dataclass(frozen=True)
class StreamRun:
    rate: float  # all events / (last group seen on advantages - worker ready)
    steady_rate: float  # events after the first output batch / (last - first output batch seen)
    cpu_us: float  # worker CPU per event, from when its ready line was seen


async def measure_stream(config: Config, bootstrap: str, n_groups: int, group_size: int, log: Path) -> StreamRun:
    """Start the worker, then time its output on ``advantages`` from its ready line to the
    last group."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from rollstream.kafka import topic_name

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    proc = start_stream_worker(config, log)
    try:
        name = topic_name(config.infra, "advantages")
        consumer.assign([TopicPartition(name, p) for p in range(config.infra.partitions or 8)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + 300
        # Poll the log closely so that the CPU count starts at the ready line (startup excluded).
        while (t_ready := ready_time(log)) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"stream worker exited or never got ready; see {log}")
            await asyncio.sleep(0.005)
        c_ready = process_cpu_s(proc.pid, children=False)
        seen, t0, t_last, first_batch, t_end = 0, 0.0, 0.0, 0, 0.0
        while seen < n_groups and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=100)
            got = sum(len(v) for v in batch.values())
            if got:
                now = time.perf_counter()
                if not seen:
                    t0, first_batch = now, got
                seen += got
                t_last, t_end = now, time.time()
            if proc.poll() is not None:
                raise SystemExit(f"stream worker exited with {proc.returncode}; see {log}")
        c_end = process_cpu_s(proc.pid, children=False)
        if seen < n_groups:
            raise SystemExit(f"stream emitted {seen}/{n_groups} groups in time; see {log}")
        events = n_groups * group_size
        return StreamRun(rate=events / (t_end - t_ready),
                         steady_rate=(seen - first_batch) * group_size / (t_last - t0),
                         cpu_us=1e6 * (c_end - c_ready) / events)
    finally:
        stop_pid(proc.pid)
        await consumer.stop()


async def measure_plain(config: Config, bootstrap: str, n_events: int) -> float:
    """consume -> decode -> encode -> produce -> await acks, per fetched batch."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from rollstream.schemas import RewardScored, codec

    rewards_codec = codec(RewardScored)
    source = f"{config.infra.topic_prefix}rewards"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_poll_records=2000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1 << 20)
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(source, p) for p in range(config.infra.partitions or 8)])
        await consumer.seek_to_beginning()
        seen, t0 = 0, 0.0
        while seen < n_events:
            batch = await consumer.getmany(timeout_ms=200, max_records=2000)
            futures = []
            for messages in batch.values():
                for m in messages:
                    event = rewards_codec.decode(m.value)
                    futures.append(await producer.send(f"{source}.plain", rewards_codec.encode(event), key=m.key))
            if futures:
                await asyncio.gather(*futures)
                if not seen:
                    t0, first = time.perf_counter(), len(futures)
                seen += len(futures)
        return (seen - first) / (time.perf_counter() - t0)
    finally:
        await producer.stop()
        await consumer.stop()


def cleanup_redis(config: Config) -> None:
    import redis as redis_sync

    client = redis_sync.Redis.from_url(config.infra.redis_url)
    try:
        keys = list(client.scan_iter(match=f"{config.infra.key_prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 2 min)")
    parser.add_argument("--json", default=None, metavar="OUT")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--groups", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per rollout")
    parser.add_argument("--within", type=float, default=StreamConfig().batch_within_s,
                        help="stream.batch_within_s of the measured worker")
    parser.add_argument("--role", default="main", choices=["main", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--events", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "bare":
        run_bare(args.config, args.events, args.out)
        return

    n_groups = args.groups or (6000 if args.quick else 25000)
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    port = free_port()
    broker = start_broker(port, work / "broker.log")
    bootstrap = f"127.0.0.1:{port}"
    config = bench_config(bootstrap, args.redis, str(work / "state"), args.group_size, args.within)
    try:
        n_events = asyncio.run(preload(config, n_groups, args.group_size, args.tokens))
        config_path = work / "bench.toml"
        from rollstream.config_load import to_toml

        config_path.write_text(to_toml(config))
        bare_out = work / "bare.json"
        with open(work / "bare.log", "wb") as bare_log:
            proc = subprocess.Popen([sys.executable, __file__, "--role", "bare", "--config", str(config_path),
                                     "--events", str(n_events), "--out", str(bare_out)],
                                    stdout=bare_log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        try:
            proc.wait(timeout=300)
        finally:
            stop_pid(proc.pid)
        bare_result = json.loads(bare_out.read_text())
        bare_ready = ready_time(work / "bare.log")
        if bare_ready is None:
            raise SystemExit(f"no ready line in {work / 'bare.log'}")
        bare, bare_cpu_us = n_events / (bare_result["end"] - bare_ready), bare_result["cpu_us"]
        run = asyncio.run(measure_stream(config, bootstrap, n_groups, args.group_size, work / "stream.log"))
        stream, stream_cpu_us = run.rate, run.cpu_us
        plain = asyncio.run(measure_plain(config, bootstrap, n_events))
    finally:
        stop_pid(broker.pid)
        cleanup_redis(config)
    result = {
        "stream_ratio": round(stream / bare, 3),
        "rewards_per_s": round(stream, 1),
        "plain_ratio": round(stream / plain, 3),
        "bare_faust_rewards_per_s": round(bare, 1),
        # CPU of the worker process per reward (Redis and broker CPU not included): less
        # sensitive than the wall-clock rates to other load on the machine.
        "stream_cpu_us_per_reward": round(stream_cpu_us, 1),
        "bare_faust_cpu_us_per_reward": round(bare_cpu_us, 1),
        "cpu_ratio": round(bare_cpu_us / stream_cpu_us, 3),
        "plain_rewards_per_s": round(plain, 1),
        # The same runs timed from their first event / first output batch instead of from
        # the ready line (see the docstring for why the headline does not use these).
        "stream_steady_rewards_per_s": round(run.steady_rate, 1),
        "bare_steady_rewards_per_s": round(bare_result["steady_rate"], 1),
        "events": n_events,
        "group_size": args.group_size,
        "completion_tokens": args.tokens,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"bench dir {work}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
