"""The archiver against a bare reader, and replay's re-scoring rate.

Measures, in one run, on a local broker started for it:

* ``archive_records_per_s``: records/s the archiver stage (consumers/archiver/stage.py) makes durable
  in the archive (decoded fields extracted, Parquet written, fsynced, renamed, offsets committed),
  from its first record received to its last one committed, on a topic of realistic
  ``ActionGenerated`` records (8 partitions);
* ``bare_records_per_s``: records/s of a bare aiokafka consumer reading the same records
  (assigned, from the beginning, nothing done with them), first record to last;
* ``archive_ratio`` = archive_records_per_s / bare_records_per_s (target >= 0.5); each side is
  run ``--rounds`` times, alternating, and its best round counts (the machine is noisy);
* ``replay_per_s``: rollouts/s of ``rollstream replay``'s path on an archive of actions and their
  rewards: read and decoded from the archive, re-executed in the Docker sandbox with the default
  executor pool (``ExecutorConfig()``), compared (target >= 150); ``replay_changed`` must be 0.

Usage: ``python bench/archive.py --quick --json OUT`` (needs dockerd and the sandbox image). The
last line printed holds the headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.common import report, with_local_broker
from rollstream.config import ArchiveConfig, Config, InfraConfig
from rollstream.kafka import EventProducer, ensure_topics, topic_name
from rollstream.schemas import ActionGenerated, RewardScored, RewardSpec, codec
from rollstream.testing import make_action

SPEC = RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"


def action(i: int, tokens: int = 160) -> ActionGenerated:
    """A realistic action: ~160 completion tokens with log-probs, a 60-token prompt."""
    base = make_action(f"g{i // 8}", i % 8)
    rollout = msgspec.structs.replace(base.rollout, prompt_token_ids=list(range(60)),
                                      completion_token_ids=list(range(100, 100 + tokens)),
                                      behaviour_logprobs=[-0.7] * tokens)
    return msgspec.structs.replace(base, rollout=rollout, reward=SPEC, completion_text=RIGHT if i % 2 else WRONG)


async def bare_read(infra: InfraConfig, full: str, n: int) -> float:
    consumer = AIOKafkaConsumer(bootstrap_servers=infra.kafka_bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", max_poll_records=5000,
                                max_partition_fetch_bytes=8 << 20, fetch_max_wait_ms=infra.fetch_max_wait_ms)
    await consumer.start()
    try:
        tps = [TopicPartition(full, p) for p in sorted(consumer.partitions_for_topic(full))]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got, first = 0, None
        while got < n:
            for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                if first is None:
                    first = time.perf_counter()
                got += len(records)
        return n / (time.perf_counter() - first)
    finally:
        await consumer.stop()


async def archive_read(config: Config, n: int) -> float:
    from rollstream.consumers.archiver.stage import open_archiver

    stop = asyncio.Event()
    async with open_archiver(config) as archiver:
        task = asyncio.create_task(archiver.run(stop))
        while archiver.records_total < n:
            await asyncio.sleep(0.01)
            if task.done():
                task.result()
        elapsed = time.perf_counter() - archiver.first_record_at
        stop.set()
        await task
    return n / elapsed


async def replay(config: Config, root: str, n: int) -> tuple[float, int, int]:
    from rollstream.cli.replay import rescore_in_sandbox
    from rollstream.replay import Selection, SpecSource, load_from_archive

    started = time.perf_counter()
    items = await asyncio.to_thread(load_from_archive, root, Selection(limit=n))
    outcomes = await rescore_in_sandbox(config, items, SpecSource(None, []))
    seconds = time.perf_counter() - started
    return len(outcomes) / seconds, sum(o.changed for o in outcomes), sum(o.error is not None for o in outcomes)


async def score_once(actions: list[ActionGenerated]) -> dict[str, RewardScored]:
    """completion text -> the RewardScored the executor gives it (one sandbox run each)."""
    from rollstream.config import ExecutorConfig
    from rollstream.consumers.executor.pool import DockerSandboxPool
    from rollstream.consumers.executor.rewards import default_registry
    from rollstream.consumers.executor.stage import score_action

    async with DockerSandboxPool(ExecutorConfig(pool_size=1)) as pool:
        return {a.completion_text: (await score_action(pool, default_registry(), a, "bench"))[0] for a in actions}


async def bench(bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rollstream-archive-bench-"))
    try:
        return await measure(bootstrap, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def measure(bootstrap: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    infra = InfraConfig(kafka_bootstrap=bootstrap, topic_prefix="bench.", partitions=8, linger_ms=5,
                        state_dir=str(work))
    await ensure_topics(infra, ["actions", "rewards"])
    actions = [action(i) for i in range(args.replay)]  # kept: replay reads these back
    async with EventProducer(infra, client_id="bench") as producer:
        for at in range(0, args.records, 5000):
            await producer.send_many([("actions", actions[i] if i < len(actions) else action(i))
                                      for i in range(at, min(at + 5000, args.records))])
        # What the replayed actions earned "then": scored by the same code (each of the two
        # completions once), so replay must find 0 changes.
        then = await score_once([actions[0], actions[1]])
        await producer.send_many([("rewards", msgspec.structs.replace(then[a.completion_text], rollout=a.rollout))
                                  for a in actions[:args.replay]])
    full = topic_name(infra, "actions")
    bare, archived = [], []
    from rollstream.lifecycle import tune_gc

    tune_gc()  # as the stage process has it (rollstream.cli)
    for round_ in range(args.rounds):
        bare.append(await bare_read(infra, full, args.records))
        config = Config(infra=infra, archive=ArchiveConfig(url=str(work / f"archive-{round_}"), flush_s=0.1))
        archived.append(await archive_read(config, args.records))
        print(f"round {round_ + 1}: bare {bare[-1]:.0f} records/s, archiver {archived[-1]:.0f} records/s",
              flush=True)
    # The last round's archive also holds the rewards (it read every topic): replay from it.
    root = str(work / f"archive-{args.rounds - 1}")
    replay_per_s, changed, errors = await replay(Config(infra=infra), root, args.replay)
    figures = {
        "records": args.records,
        "record_bytes": len(codec(ActionGenerated).encode(actions[0])),
        "bare_records_per_s": round(max(bare), 1),
        "archive_records_per_s": round(max(archived), 1),
        "replay_rollouts": args.replay,
        "replay_changed": changed,
        "replay_errors": errors,
        "archive_ratio": round(max(archived) / max(bare), 3),
        "replay_per_s": round(replay_per_s, 1),
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and rollouts (about two minutes)")
    parser.add_argument("--records", type=int, default=None,
                        help="records on the topic (default 400000; quick 150000: fewer measure mostly the fixed "
                             "cost of the last write)")
    parser.add_argument("--replay", type=int, default=None, help="rollouts replayed (default 3000; quick 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each reader (best counts)")
    parser.add_argument("--json", dest="json_out", help="write the headline figures here")
    args = parser.parse_args()
    args.records = args.records or (150_000 if args.quick else 400_000)
    args.replay = min(args.records, args.replay or (1000 if args.quick else 3000))
    figures = with_local_broker(lambda bootstrap: bench(bootstrap, args))
    report(figures, args.json_out)


if __name__ == "__main__":
    main()
