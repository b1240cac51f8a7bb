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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from rollstream.config import Config
from rollstream.config_load import parse_value
from rollstream.errors import ConfigError
from rollstream.schemas import codec
from rollstream.schemas.events import ActionGenerated, RewardScored, RewardSpec

CHANGE_EPS = 1e-9


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


@dataclass
class Item:
    """One recorded action and what it earned then."""

    partition: int
    offset: int
    timestamp_ms: int
    action: ActionGenerated
    before: RewardScored | None = None


@dataclass
class Outcome:
    item: Item
    after: RewardScored | None = None
    error: str | None = None

    @property
    def changed(self) -> bool:
        before, after = self.item.before, self.after
        if before is None or after is None:  # never scored before (the run ended first), or not now
            return False
        return (abs(before.reward - after.reward) > CHANGE_EPS
                or before.execution.verdict != after.execution.verdict)

    @property
    def flipped(self) -> bool:
        before, after = self.item.before, self.after
        return before is not None and after is not None and before.execution.passed != after.execution.passed


@dataclass
class FamilyRow:
    rollouts: int = 0
    before: list[float] = field(default_factory=list)
    after: list[float] = field(default_factory=list)
    changed: int = 0
    to_pass: int = 0
    to_fail: int = 0
    errors: int = 0
    new: int = 0  # no verdict recorded before (the run ended before the executor scored them)

    def add(self, outcome: Outcome) -> None:
        self.rollouts += 1
        if outcome.item.before is not None:
            self.before.append(outcome.item.before.reward)
        if outcome.after is not None:
            self.after.append(outcome.after.reward)
        self.changed += outcome.changed
        self.errors += outcome.error is not None
        self.new += outcome.item.before is None
        if outcome.flipped:
            if outcome.after.execution.passed:  # type: ignore[union-attr]
                self.to_pass += 1
            else:
                self.to_fail += 1

    def summary(self) -> dict[str, Any]:
        mean = lambda xs: sum(xs) / len(xs) if xs else None
        return {"rollouts": self.rollouts, "reward_before": mean(self.before), "reward_after": mean(self.after),
                "changed": self.changed, "flipped_to_pass": self.to_pass, "flipped_to_fail": self.to_fail,
                "errors": self.errors, "not_scored_before": self.new}


def parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"cannot read the time {text!r}: give ISO 8601 (2026-12-01T07:00) or Unix seconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def apply_spec_overrides(spec: RewardSpec, overrides: Iterable[str]) -> RewardSpec:
    """``spec`` with ``FIELD=VALUE`` overrides (``weights.NAME=VALUE`` sets one weight); validated."""
    overrides = list(overrides)
    if not overrides:
        return spec
    tree = msgspec.to_builtins(spec)
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--spec {item!r}: expected FIELD=VALUE")
        value = parse_value(text.strip())
        if "." in key:
            head, _, rest = key.partition(".")
            if head != "weights" or not rest:
                raise ConfigError(f"--spec {item!r}: only weights.NAME nests")
            tree.setdefault("weights", {})[rest] = value
        elif key not in RewardSpec.__struct_fields__:
            raise ConfigError(f"--spec {item!r}: RewardSpec has no field {key!r}; fields: "
                              f"{', '.join(RewardSpec.__struct_fields__)}")
        else:
            tree[key] = value
    try:
        return msgspec.convert(tree, RewardSpec)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"--spec {' '.join(overrides)}: {exc}") from exc


class SpecSource:
    """The spec each action is re-scored with: recorded, or the task source's now, then overridden."""

    def __init__(self, tasks: str | None, overrides: list[str]) -> None:
        self.overrides = overrides
        self.by_task: dict[str, RewardSpec] | None = None
        if tasks:
            from rollstream.tasks.sources import load_tasks

            self.by_task = {t.task_id: t.reward for t in load_tasks([tasks])}
        apply_spec_overrides(RewardSpec(), overrides)  # a bad override fails before anything runs
        self.cache: dict[bytes, RewardSpec] = {}

    def spec_for(self, action: ActionGenerated) -> RewardSpec | None:
        """None when ``--tasks`` has no task with the action's task id."""
        base = action.reward
        if self.by_task is not None:
            found = self.by_task.get(action.rollout.task_id)
            if found is None:
                return None
            base = found
        if not self.overrides:
            return base
        key = msgspec.msgpack.encode(base)
        if key not in self.cache:
            self.cache[key] = apply_spec_overrides(base, self.overrides)
        return self.cache[key]


def run_paths(config: Config, run: str) -> tuple[Path, dict[str, Any]]:
    """The run directory of ``run`` (an id under state_dir/runs or a path) and its run.json."""
    path = Path(run)
    if not (path / "run.json").is_file() and not (path / "archive").exists():
        path = Path(config.infra.state_dir) / "runs" / run
    if not path.is_dir():
        raise ConfigError(f"no run {run!r}: neither a run directory nor a run id under {config.infra.state_dir}/runs "
                          "(`rollstream runs` lists them)")
    info = {}
    if (path / "run.json").is_file():
        info = json.loads((path / "run.json").read_text())
    return path, info


def archive_of(config: Config, run: str | None, archive: str | None) -> str:
    if archive:
        return archive
    if run is None:
        from rollstream.archive import archive_url

        return archive_url(config)
    path, info = run_paths(config, run)
    return info.get("archive") or str(path / "archive")


class Selection:
    """The actions the flags select (applied to archive rows and to broker records alike)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.groups, self.rollouts = set(args.group), set(args.rollout)
        self.tasks, self.families = set(args.task), set(args.family)
        self.partitions = set(args.partition) or None
        self.from_offset, self.to_offset = args.from_offset, args.to_offset
        self.since, self.until = parse_time(args.since), parse_time(args.until)
        self.limit = args.limit

    def filters(self) -> list[tuple[str, str, Any]] | None:
        """pyarrow filters for what the archive's columns can decide."""
        out: list[tuple[str, str, Any]] = []
        for column, values in (("group_id", self.groups), ("rollout_id", self.rollouts), ("task_id", self.tasks),
                               ("family", self.families)):
            if values:
                out.append((column, "in", sorted(values)))
        if self.from_offset is not None:
            out.append(("offset", ">=", self.from_offset))
        if self.to_offset is not None:
            out.append(("offset", "<=", self.to_offset))
        return out or None

    def matches(self, partition: int, offset: int, timestamp_ms: int, action: ActionGenerated) -> bool:
        r = action.rollout
        return ((not self.groups or r.group_id in self.groups) and (not self.rollouts or r.rollout_id in self.rollouts)
                and (not self.tasks or r.task_id in self.tasks) and (not self.families or r.family in self.families)
                and (self.partitions is None or partition in self.partitions)
                and (self.from_offset is None or offset >= self.from_offset)
                and (self.to_offset is None or offset <= self.to_offset)
                and (self.since is None or timestamp_ms >= self.since * 1000)
                and (self.until is None or timestamp_ms <= self.until * 1000))


def load_from_archive(root: str, selection: Selection) -> list[Item]:
    from rollstream.archive import ArchiveStore

    store = ArchiveStore(root)
    if not store.exists():
        raise ConfigError(f"no archive at {root} (was the run started with archive.enabled = false?)")
    partitions = selection.partitions
    if selection.groups and partitions is None:  # a group's records all sit in one partition
        found = [store.group_partitions("actions", g) for g in selection.groups]
        if all(found):
            partitions = {p for ps in found for p in ps}  # type: ignore[union-attr]
    items, rollouts = [], set()
    for row, action in store.events("actions", partitions=partitions, since=selection.since, until=selection.until,
                                    filters=selection.filters()):
        ts = int(row["timestamp"].timestamp() * 1000)
        if selection.matches(row["partition"], row["offset"], ts, action):
            items.append(Item(row["partition"], row["offset"], ts, action))
            rollouts.add(action.rollout.rollout_id)
            if selection.limit and len(rollouts) >= selection.limit:
                break  # read in (partition, offset) order: the rest comes after
    rollouts = {i.action.rollout.rollout_id for i in items}
    before: dict[str, RewardScored] = {}
    if rollouts:
        reward_filters = [("rollout_id", "in", sorted(rollouts))] if len(rollouts) <= 5000 else None
        for _, reward in store.events("rewards", filters=reward_filters):
            before.setdefault(reward.rollout.rollout_id, reward)  # the first verdict recorded
    return _attach(items, before, selection.limit)


async def load_from_broker(config: Config, prefix: str, selection: Selection) -> list[Item]:
    from rollstream.kafka import read_to_end
    from rollstream.schemas import SchemaError

    items = []
    action_codec, reward_codec = codec(ActionGenerated), codec(RewardScored)
    for record in await read_to_end(config.infra, f"{prefix}actions"):
        try:
            action = action_codec.decode(record.value)
        except SchemaError:
            continue
        if selection.matches(record.partition, record.offset, record.timestamp, action):
            items.append(Item(record.partition, record.offset, record.timestamp, action))
    before: dict[str, RewardScored] = {}
    for record in await read_to_end(config.infra, f"{prefix}rewards"):
        try:
            reward = reward_codec.decode(record.value)
        except SchemaError:
            continue
        before.setdefault(reward.rollout.rollout_id, reward)
    return _attach(items, before, selection.limit)


def _attach(items: list[Item], before: dict[str, RewardScored], limit: int) -> list[Item]:
    """Each rollout once (the first action recorded: a redelivered group repeats its actions), in
    (partition, offset) order, with the reward recorded for it."""
    items.sort(key=lambda i: (i.partition, i.offset))
    seen: set[str] = set()
    out = []
    for item in items:
        rollout_id = item.action.rollout.rollout_id
        if rollout_id in seen:
            continue
        seen.add(rollout_id)
        item.before = before.get(rollout_id)
        out.append(item)
        if limit and len(out) >= limit:
            break
    return out


class Progress:
    """A progress line on stderr: redrawn in a terminal, every 5 s otherwise."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self.started = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.done == self.total or now - self.last >= (0.2 if self.tty else 5.0):
            self.last = now
            rate = self.done / max(now - self.started, 1e-9)
            left = (self.total - self.done) / rate if rate else 0
            width = 30
            bar = "#" * int(width * self.done / max(self.total, 1))
            line = f"replay [{bar:<{width}}] {self.done}/{self.total} {rate:.1f}/s, {left:.0f} s left"
            print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)
            if self.tty and self.done == self.total:
                print(file=sys.stderr)


async def rescore(config: Config, items: list[Item], specs: SpecSource, *, backend: Any = None) -> list[Outcome]:
    """Score every item again (at most ``executor.concurrency`` at once), in input order."""
    from rollstream.consumers.executor import score_action
    from rollstream.consumers.rewards import default_registry
    from rollstream.errors import SandboxError

    registry = default_registry()
    gate = asyncio.Semaphore(config.executor.concurrency)
    progress = Progress(len(items))

    async def one(item: Item, pool: Any) -> Outcome:
        spec = specs.spec_for(item.action)
        if spec is None:
            progress.step()
            return Outcome(item, error=f"no task {item.action.rollout.task_id!r} in --tasks")
        action = msgspec.structs.replace(item.action, reward=spec)
        try:
            async with gate:
                after, _ = await score_action(pool, registry, action, "replay", config.executor.max_timeout_s)
        except (ValueError, SandboxError) as exc:
            return Outcome(item, error=f"{type(exc).__name__}: {exc}")
        finally:
            progress.step()
        return Outcome(item, after=after)

    async def all_of(pool: Any) -> list[Outcome]:
        return list(await asyncio.gather(*(one(item, pool) for item in items)))

    if backend is not None:
        return await all_of(backend)
    from rollstream.consumers.sandbox import DockerSandboxPool

    async with DockerSandboxPool(config.executor) as pool:
        return await all_of(pool)


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    def verdict(reward: RewardScored | None) -> dict[str, Any] | None:
        if reward is None:
            return None
        e = reward.execution
        return {"reward": reward.reward, "components": reward.components, "verdict": e.verdict, "passed": e.passed,
                "error_kind": e.error_kind, "tests_passed": e.tests_passed, "tests_total": e.tests_total,
                "error_message": e.error_message}

    r = outcome.item.action.rollout
    return {"rollout_id": r.rollout_id, "group_id": r.group_id, "task_id": r.task_id, "family": r.family,
            "partition": outcome.item.partition, "offset": outcome.item.offset,
            "before": verdict(outcome.item.before), "after": verdict(outcome.after), "changed": outcome.changed,
            "flipped": outcome.flipped, "error": outcome.error}


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    families: dict[str, FamilyRow] = {}
    total = FamilyRow()
    for outcome in outcomes:
        families.setdefault(outcome.item.action.rollout.family, FamilyRow()).add(outcome)
        total.add(outcome)
    return {"families": {f: row.summary() for f, row in sorted(families.items())}, "all": total.summary()}


def table(summary: dict[str, Any]) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:+.3f}"

    lines = [f"{'family':<20} {'rollouts':>8} {'before':>8} {'after':>8} {'changed':>8} {'->pass':>7} {'->fail':>7}"]
    for name, row in [*summary["families"].items(), ("(all)", summary["all"])]:
        lines.append(f"{name[:20]:<20} {row['rollouts']:>8} {fmt(row['reward_before']):>8} "
                     f"{fmt(row['reward_after']):>8} {row['changed']:>8} {row['flipped_to_pass']:>7} "
                     f"{row['flipped_to_fail']:>7}")
    return "\n".join(lines)


async def write_topic(config: Config, name: str, outcomes: list[Outcome]) -> int:
    from aiokafka import AIOKafkaProducer

    from rollstream.kafka import create_topic

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
    specs = SpecSource(args.tasks, args.spec)
    selection = Selection(args)
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
        items = await load_from_broker(config, prefix, selection)
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
    outcomes = await rescore(config, items, specs)
    seconds = time.monotonic() - started
    summary = summarise(outcomes)
    summary.update(seconds=seconds, per_s=len(outcomes) / max(seconds, 1e-9), source=where,
                   changed_rollouts=[o.item.action.rollout.rollout_id for o in outcomes if o.changed])
    if args.jsonl and args.jsonl != "-":
        Path(args.jsonl).write_text("".join(json.dumps(outcome_json(o)) + "\n" for o in outcomes))
    print(table(summary))
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
