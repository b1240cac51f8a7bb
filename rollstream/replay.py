"""Re-scoring recorded actions: which ones (:class:`Selection`), read from the run archive or the
live topics, with which reward spec (:class:`SpecSource`), scored again by the caller's scorer
(:func:`rescore`), and what changed (:func:`summarise`). ``rollstream replay`` (cli/replay.py) is
the command around it and brings the sandbox; the archive itself is :mod:`rollstream.archive`.

Each rollout is replayed once (the first action recorded for it: a redelivered group repeats its
actions), in (partition, offset) order, next to the first verdict recorded for it then.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from rollstream.config import InfraConfig
from rollstream.config_load import parse_value
from rollstream.errors import ConfigError, SandboxError
from rollstream.schemas import codec
from rollstream.schemas.events import ActionGenerated, RewardScored, RewardSpec

CHANGE_EPS = 1e-9
SPECS_KEPT = 4096  # distinct recorded specs whose overridden version is kept
Scorer = Callable[[ActionGenerated], Awaitable[RewardScored]]


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

    @property
    def test_changes(self) -> list[str]:
        """Each test whose result changed, in words ("test 2 now fails: AssertionError: 4 == 5"),
        from the two verdicts' per-test results (none when the recorded verdict has none)."""
        before, after = self.item.before, self.after
        if before is None or after is None or not before.execution.test_results:
            return []
        was = {r.index: r for r in before.execution.test_results}
        changes = []
        for now in after.execution.test_results:
            old = was.get(now.index)
            if old is None or old.outcome == now.outcome:
                continue
            verb = {"passed": "passes", "failed": "fails", "error": "errors", "skipped": "is skipped"}[now.outcome]
            why = f"{now.error_type}: {now.message}".strip(": ")
            name = f"test {now.index}" + (f" ({now.node_id})" if now.node_id else "")
            changes.append(f"{name} now {verb} (was {old.outcome})" + (f": {why[:300]}" if why else ""))
        return changes


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
        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        return {"rollouts": self.rollouts, "reward_before": mean(self.before), "reward_after": mean(self.after),
                "changed": self.changed, "flipped_to_pass": self.to_pass, "flipped_to_fail": self.to_fail,
                "errors": self.errors, "not_scored_before": self.new}


def parse_time(text: str | None) -> float | None:
    """Unix seconds of ``text``: ISO 8601 (UTC unless it says) or Unix seconds; None stays None."""
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
        # actions of a task share its spec: each distinct one is overridden once (by its encoding)
        self._overridden = functools.lru_cache(maxsize=SPECS_KEPT)(self._override)

    def _override(self, encoded: bytes) -> RewardSpec:
        return apply_spec_overrides(msgspec.msgpack.decode(encoded, type=RewardSpec), self.overrides)

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
        return self._overridden(msgspec.msgpack.encode(base))


@dataclass
class Selection:
    """Which actions to replay (applied to archive rows and to broker records alike); empty sets
    and None bounds select everything."""

    groups: set[str] = field(default_factory=set)
    rollouts: set[str] = field(default_factory=set)
    tasks: set[str] = field(default_factory=set)
    families: set[str] = field(default_factory=set)
    partitions: set[int] | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    since: float | None = None  # Unix seconds
    until: float | None = None
    limit: int = 0  # 0: all

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
    """The selected actions of the archive at ``root``, each with the reward recorded for it."""
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
    before: dict[str, RewardScored] = {}
    if rollouts:
        reward_filters = [("rollout_id", "in", sorted(rollouts))] if len(rollouts) <= 5000 else None
        for _, reward in store.events("rewards", filters=reward_filters):
            before.setdefault(reward.rollout.rollout_id, reward)  # the first verdict recorded
    return _attach(items, before, selection.limit)


async def load_from_broker(infra: InfraConfig, prefix: str, selection: Selection) -> list[Item]:
    """The selected actions of the live topics ``{prefix}actions``, each with the reward recorded
    for it on ``{prefix}rewards``."""
    from rollstream.kafka import read_to_end
    from rollstream.schemas import SchemaError

    items = []
    action_codec, reward_codec = codec(ActionGenerated), codec(RewardScored)
    for record in await read_to_end(infra, f"{prefix}actions"):
        try:
            action = action_codec.decode(record.value)
        except SchemaError:
            continue
        if selection.matches(record.partition, record.offset, record.timestamp, action):
            items.append(Item(record.partition, record.offset, record.timestamp, action))
    before: dict[str, RewardScored] = {}
    for record in await read_to_end(infra, f"{prefix}rewards"):
        try:
            reward = reward_codec.decode(record.value)
        except SchemaError:
            continue
        before.setdefault(reward.rollout.rollout_id, reward)
    return _attach(items, before, selection.limit)


def _attach(items: list[Item], before: dict[str, RewardScored], limit: int) -> list[Item]:
    """Each rollout once (the first action recorded), in (partition, offset) order, with the reward
    recorded for it."""
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


async def rescore(items: list[Item], specs: SpecSource, score: Scorer, *, concurrency: int,
                  done: Callable[[], None] = lambda: None) -> list[Outcome]:
    """Score every item again with ``score`` (at most ``concurrency`` at once), in input order;
    ``done()`` after each. A scorer's ValueError or SandboxError is that item's error."""
    gate = asyncio.Semaphore(concurrency)

    async def one(item: Item) -> Outcome:
        spec = specs.spec_for(item.action)
        if spec is None:
            done()
            return Outcome(item, error=f"no task {item.action.rollout.task_id!r} in --tasks")
        action = msgspec.structs.replace(item.action, reward=spec)
        try:
            async with gate:
                after = await score(action)
        except (ValueError, SandboxError) as exc:
            return Outcome(item, error=f"{type(exc).__name__}: {exc}")
        finally:
            done()
        return Outcome(item, after=after)

    return list(await asyncio.gather(*(one(item) for item in items)))


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """One line of ``--jsonl``: the rollout, where it was read, and both verdicts."""
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
            "flipped": outcome.flipped, "test_changes": outcome.test_changes, "error": outcome.error}


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    """Per family and in all: rollouts, mean reward before and after, changed, flipped, errors."""
    families: dict[str, FamilyRow] = {}
    total = FamilyRow()
    for outcome in outcomes:
        families.setdefault(outcome.item.action.rollout.family, FamilyRow()).add(outcome)
        total.add(outcome)
    return {"families": {f: row.summary() for f, row in sorted(families.items())}, "all": total.summary()}
