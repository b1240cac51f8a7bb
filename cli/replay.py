"""``rollstream replay``: re-score recorded actions with the current reward code and say what changed.

Actions come from the archive of a run (``--run RUN`` or ``--archive URL``: works after the broker
is gone) or from the live topics (``--from-broker``: the run's prefix, else ``infra.topic_prefix``),
selected by group, rollout, task, family, partition, offset range and time range. Each is
executed again in the sandbox with the reward spec it was scored with (default), the spec the
task source defines now (``--tasks SOURCE``, matched by task id), and/or spec fields overridden
(``--spec timeout_s=1``, ``--spec weights.tests=2``, ``--spec 'tests=["assert f(1) == 2"]'``).

Output: a table per family (rollouts, mean reward before and after, rollouts whose reward or
verdict changed, verdicts that flipped between pass and fail), and one JSON line per rollout with
both verdicts (``--jsonl``). ``--to-topic NAME`` also writes the re-scored ``RewardScored``
events to topic NAME (keyed by group id, as ``rewards`` is), so a fixed reward can feed a new
stream and learner run; the run's live ``rewards`` topic only with ``--live``.

The selection, loading and re-scoring are rollstream/replay.py's; this module is the command: its
flags, the sandbox it scores in, and the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollstream.config import Config
from rollstream.errors import ConfigError

if TYPE_CHECKING:  # the parser is built for every command: what replay runs is imported when it runs
    from rollstream.replay import Item, Outcome, Selection, SpecSource
    from rollstream.schemas.events import ActionGenerated, RewardScored


def register(name: str, p: argparse.ArgumentParser) -> Any:
    add_arguments(p)
    return lambda args, config: asyncio.run(replay_main(config, args))


def add_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_argument_group("where the actions come from")
    source.add_argument("--run", help="a run id under infra.state_dir/runs, or a run directory: its archive")
    source.add_argument("--archive", help="an archive root (directory or fsspec URL) instead of a run's")
    source.add_argument("--from-broker", action="store_true",
                        help="read the live topics instead of the archive (the run's topic prefix with --run, "
                             "else infra.topic_prefix)")
    select = p.add_argument_group("which actions")
    select.add_argument("--group", action="append", default=[], help="group id (repeatable)")
    select.add_argument("--rollout", action="append", default=[], help="rollout id (repeatable)")
    select.add_argument("--task", action="append", default=[], help="task id (repeatable)")
    select.add_argument("--family", action="append", default=[], help="task family (repeatable)")
    select.add_argument("--partition", type=int, action="append", default=[],
                        help="partition of the actions topic (repeatable)")
    select.add_argument("--from-offset", type=int, help="first offset on the actions topic (per partition)")
    select.add_argument("--to-offset", type=int, help="last offset on the actions topic (per partition)")
    select.add_argument("--since", help="actions produced at or after: ISO time (UTC unless it says) or Unix seconds")
    select.add_argument("--until", help="actions produced at or before (same forms)")
    select.add_argument("--limit", type=int, default=0, help="at most this many actions (0: all)")
    spec = p.add_argument_group("which reward spec")
    spec.add_argument("--tasks", metavar="SOURCE",
                      help="score with the spec the task source defines now (builtin, jsonl:PATH, ...), by task id")
    spec.add_argument("--spec", action="append", default=[], metavar="FIELD=VALUE",
                      help="override a reward spec field (TOML value; weights.NAME for one weight); repeatable")
    out = p.add_argument_group("output")
    out.add_argument("--jsonl", default="replay.jsonl", help="one line per rollout with both verdicts "
                                                              "(default replay.jsonl; '-' for none)")
    out.add_argument("--to-topic", metavar="NAME", help="also write the re-scored RewardScored events to this topic")
    out.add_argument("--live", action="store_true", help="allow --to-topic to be the run's live rewards topic")
    out.add_argument("--json", dest="json_out", help="write the summary (per family and in all) as JSON here")


def selection_of(args: argparse.Namespace) -> Selection:
    from rollstream.replay import Selection, parse_time

    return Selection(groups=set(args.group), rollouts=set(args.rollout), tasks=set(args.task),
                     families=set(args.family), partitions=set(args.partition) or None,
                     from_offset=args.from_offset, to_offset=args.to_offset, since=parse_time(args.since),
                     until=parse_time(args.until), limit=args.limit)


async def rescore_in_sandbox(config: Config, items: list[Item], specs: SpecSource, *,
                             backend: Any = None, conditions: list[str] | None = None) -> list[Outcome]:
    """Score every item again as the executor does (``backend``, else a Docker sandbox pool of
    ``config.executor``), at most ``executor.concurrency`` at once, with a progress bar. Into
    ``conditions``: how the sandbox image or runtime differ from those the recorded (signed)
    verdicts name."""
    from rollstream.cli.tables import progress
    from rollstream.consumers.executor.rewards import default_registry
    from rollstream.consumers.executor.stage import score_action
    from rollstream.replay import rescore

    registry = default_registry()

    async def all_of(pool: Any) -> list[Outcome]:
        async def score(action: ActionGenerated) -> RewardScored:
            after, _ = await score_action(pool, registry, action, "replay", config.executor.max_timeout_s)
            return after

        if conditions is not None:
            from rollstream.cli.verify import conditions as differ
            from rollstream.consumers.executor.jobs import sandbox_identity

            image, runtime = sandbox_identity(pool)
            conditions.extend(sorted({note for item in items if item.before is not None
                                      for note in differ(item.before, image, runtime)}))
        with progress("replay", len(items)) as step:
            return await rescore(items, specs, score, concurrency=config.executor.concurrency, done=step)

    if backend is not None:
        return await all_of(backend)
    from rollstream.consumers.executor.pool import DockerSandboxPool

    async with DockerSandboxPool(config.executor) as pool:
        return await all_of(pool)


def table(summary: dict[str, Any]) -> str:
    from rollstream.cli.tables import table as render

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:+.3f}"

    rows = [[name[:20], row["rollouts"], fmt(row["reward_before"]), fmt(row["reward_after"]), row["changed"],
             row["flipped_to_pass"], row["flipped_to_fail"]]
            for name, row in [*summary["families"].items(), ("(all)", summary["all"])]]
    columns = ["family", "rollouts", "before", "after", "changed", "->pass", "->fail"]
    return render(columns, rows, right=columns[1:])


async def write_topic(config: Config, name: str, outcomes: list[Outcome]) -> int:
    from aiokafka import AIOKafkaProducer

    from rollstream.kafka import create_topic
    from rollstream.schemas import codec
    from rollstream.schemas.events import RewardScored

    partitions = config.infra.partitions or 8
    await create_topic(config.infra, name, partitions)
    producer = AIOKafkaProducer(bootstrap_servers=config.infra.kafka_bootstrap, acks="all", linger_ms=5)
    await producer.start()
    encode = codec(RewardScored).encode
    try:
        futures = [await producer.send(name, encode(o.after), key=o.after.rollout.group_id.encode())
                   for o in outcomes if o.after is not None]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(futures)


async def replay_main(config: Config, args: argparse.Namespace) -> int:
    """`rollstream replay`: 0 when every selected action was re-scored, 1 when some could not be."""
    from rollstream.cli.records import archive_of, run_paths
    from rollstream.replay import SpecSource, load_from_archive, load_from_broker, outcome_json, summarise

    specs = SpecSource(args.tasks, args.spec)
    selection = selection_of(args)
    info: dict[str, Any] = {}
    if args.run:
        _, info = run_paths(config, args.run)
    prefix = info.get("topic_prefix") or config.infra.topic_prefix
    if args.to_topic == f"{prefix}rewards" and not args.live:
        raise ConfigError(f"--to-topic {args.to_topic} is the run's live rewards topic: give --live to write there")
    if args.from_broker or args.to_topic:
        from rollstream.infra import with_local_endpoints

        config = with_local_endpoints(config)
    if args.from_broker:
        items = await load_from_broker(config.infra, prefix, selection)
        where = f"topics {prefix}actions/rewards on {config.infra.kafka_bootstrap}"
    else:
        root = archive_of(config, args.run, args.archive)
        items = await asyncio.to_thread(load_from_archive, root, selection)
        where = f"archive {root}"
    if not items:
        print(f"replay: no actions in {where} match the selection")
        return 1
    print(f"replay: {len(items)} rollouts from {where}", file=sys.stderr)
    started = time.monotonic()
    conditions: list[str] = []
    outcomes = await rescore_in_sandbox(config, items, specs, conditions=conditions)
    for note in conditions:  # the recorded verdicts name another sandbox than this one
        print(f"replay: re-scored under other conditions than the recorded verdicts: {note}")
    seconds = time.monotonic() - started
    summary = summarise(outcomes)
    summary.update(seconds=seconds, per_s=len(outcomes) / max(seconds, 1e-9), source=where,
                   changed_rollouts=[o.item.action.rollout.rollout_id for o in outcomes if o.changed])
    if args.jsonl and args.jsonl != "-":
        Path(args.jsonl).write_text("".join(json.dumps(outcome_json(o)) + "\n" for o in outcomes))
    print(table(summary))
    shown = [o for o in outcomes if o.changed and o.test_changes][:10]
    for o in shown:  # what changed inside the verdicts, test by test
        print(f"{o.item.action.rollout.rollout_id}: " + "; ".join(o.test_changes[:3]))
    total = summary["all"]
    print(f"{total['changed']} of {total['rollouts']} rollouts changed ({total['flipped_to_pass']} now pass, "
          f"{total['flipped_to_fail']} now fail), {total['not_scored_before']} had no verdict before, "
          f"{total['errors']} could not be scored; "
          f"{len(outcomes) / max(seconds, 1e-9):.1f} rollouts/s"
          + (f"; per rollout: {args.jsonl}" if args.jsonl and args.jsonl != "-" else ""))
    if args.to_topic:
        sent = await write_topic(config, args.to_topic, outcomes)
        print(f"wrote {sent} RewardScored events to {args.to_topic}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if total["errors"] == 0 else 1
