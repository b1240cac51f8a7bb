"""The learner's bookkeeping: every group it consumes is decided once, in one vocabulary.

A group is **trained**, **filtered** (the stream found nothing to train on, with its reason) or
**dropped** with a reason (``stale``, ``duplicate``, ``invalid``): ``schemas.events.group_outcome``,
the vocabulary the sampler, ``rollstream run``'s progress line, ``runs``, ``inspect`` and the
metrics share. :meth:`Ledger.decide` records decisions, in this order, so that nothing is lost on
a crash: the ``GroupFate`` of each group goes to ``fates`` and is acknowledged; then the groups
are counted (``rollstream_learner_groups_total{outcome, reason}``, Redis ``progress:groups``),
marked done on ``advantages`` (their offsets may be committed at the next checkpoint) and added
to the lineage (consumed count, recent ids). Capacity goes back to the sampler with
:meth:`Ledger.release`, holding back the groups trained into a version not yet published.
Each step leaves one line in ``steps.jsonl`` (:meth:`Ledger.log_step`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollstream.config import Config
from rollstream.kafka import Delivery, EventConsumer, EventProducer
from rollstream.learner import checkpoint as ckpt
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.setup import Lineage
from rollstream.redis import count_outcomes, set_groups_consumed
from rollstream.schemas.events import GroupAdvantaged, GroupFate, GroupFateKind, group_outcome

log = logging.getLogger(__name__)


@dataclass
class Window:
    """What the groups resolved since the last step record say about the policy: every one of
    them (trained, dropped as stale, filtered), so that reward and pass rate are the policy's,
    not only those of the groups that had something to train on."""

    groups: int = 0
    filtered: int = 0
    excluded: int = 0  # rollouts the stream left out (outcome infra: the machinery failed under them)
    rewards: list[float] = field(default_factory=list)
    passed: list[bool] = field(default_factory=list)
    families: dict[str, list[float]] = field(default_factory=dict)

    def add(self, group: GroupAdvantaged) -> None:
        self.groups += 1
        self.filtered += bool(group.filtered)
        self.excluded += len(group.excluded)
        for item in group.rollouts:
            self.rewards.append(item.reward)
            if item.passed is not None:
                self.passed.append(item.passed)
            self.families.setdefault(group.family, []).append(item.reward)

    def summary(self) -> dict[str, Any]:
        n = len(self.rewards)
        return {
            "groups_resolved": self.groups, "groups_filtered": self.filtered, "completions": n,
            "rollouts_excluded": self.excluded,
            "reward_mean": sum(self.rewards) / n if n else None,
            "pass_rate": sum(self.passed) / len(self.passed) if self.passed else None,
            "family_reward": {f: sum(r) / len(r) for f, r in sorted(self.families.items())},
        }


def step_log_dir(config: Config) -> Path:
    """Where ``steps.jsonl`` goes: the checkpoint directory, or with checkpoints on object
    storage (no appends there) ``infra.state_dir/learner``."""
    where = config.learner.checkpoint.dir
    return Path(config.infra.state_dir) / "learner" if sharded_ckpt.is_url(where) else Path(where)


@dataclass(frozen=True)
class Decision:
    """One group's fate before it is recorded."""

    delivery: Delivery[GroupAdvantaged]
    fate: GroupFateKind
    reason: str = ""
    policy_version: int | None = None  # the version a step produced (trained), else the learner's
    trained: int = 0  # rollouts in the step
    stale: int = 0  # rollouts dropped as stale


class Ledger:
    """Fates, counts, offsets marked done, the lineage's tally, the sampler's capacity, the step log."""

    def __init__(self, config: Config, lineage: Lineage, consumer: EventConsumer[GroupAdvantaged],
                 producer: EventProducer, redis: Any, metrics: LearnerMetrics, run_id: str) -> None:
        self.config, self.lineage, self.consumer, self.producer = config, lineage, consumer, producer
        self.redis, self.metrics, self.run_id = redis, metrics, run_id
        # Groups trained into a version not yet published: their sampler capacity is held back
        # until it is, or the sampler's next groups would be generated with the old weights.
        self.unpublished = 0
        self.window = Window()  # every group resolved since the last step's record

    def fate(self, decision: Decision, learner_version: int) -> GroupFate:
        delivery, group = decision.delivery, decision.delivery.event
        return GroupFate(
            group_id=group.group_id, task_id=group.task_id, family=group.family, fate=decision.fate,
            reason=decision.reason[:4096], step=self.lineage.step,
            policy_version=learner_version if decision.policy_version is None else decision.policy_version,
            learner_version=learner_version, rollouts=len(group.rollouts), rollouts_trained=decision.trained,
            rollouts_stale=decision.stale,
            behaviour_versions=sorted({r.rollout.policy_version_first for r in group.rollouts})[:1024],
            learner_run=self.run_id, source_partition=delivery.partition, source_offset=delivery.offset,
            decided_at=time.time(), excluded=group.excluded)

    async def decide(self, decisions: Sequence[Decision], learner_version: int) -> None:
        """Record ``decisions`` (made at ``learner_version``, before any step they took): fates
        first (acknowledged), then counts, offsets done and the lineage's tally. A group dropped as
        invalid is also dead-lettered with its bytes; one dropped as a duplicate is not counted
        as consumed (this lineage consumed it already)."""
        for d in decisions:
            if d.fate == "invalid":  # with its bytes, for whoever fixes the producer
                await self.producer.dead_letter(d.delivery, d.reason, stage="learner")
        await self.producer.send_many([("fates", self.fate(d, learner_version)) for d in decisions])
        counts: dict[str, int] = {}
        for d in decisions:
            group = d.delivery.event
            outcome, reason = group_outcome(d.fate)
            self.metrics.groups.labels(outcome, reason).inc()
            name = f"{outcome}:{reason}" if reason else outcome
            counts[name] = counts.get(name, 0) + 1
            self.consumer.done(d.delivery)
            if d.fate == "duplicate":
                continue
            if d.fate != "invalid":  # the policy's figures: every group it was judged on
                self.window.add(group)
                self.metrics.observe_group(group, None if d.fate == "filtered" else learner_version)
            self.lineage.recent.extend((group.group_id,))
            self.lineage.groups_consumed += 1
        await count_outcomes(self.redis, self.config.infra, counts)

    async def release(self) -> None:
        """Tell the sampler which groups are resolved: all consumed but those trained into a
        version not yet published."""
        await set_groups_consumed(self.redis, self.config.infra, self.lineage.groups_consumed - self.unpublished)

    def log_step(self, groups: Sequence[GroupAdvantaged], rollouts: int, lags: Sequence[int], stale: int,
                 result: Any, *, domain_scales: Mapping[str, float] | None = None) -> None:
        """The step's line in ``steps.jsonl`` (and the log): its groups, lags, the window's figures
        and, when it trained, the trainer's (with learner.domain_normalize, each domain's scale)."""
        record: dict[str, Any] = {
            "run_id": self.run_id, "step": self.lineage.step, "policy_version": self.lineage.version,
            "groups_consumed": self.lineage.groups_consumed,
            "trained": result is not None, "groups": [g.group_id for g in groups],
            "rollouts": rollouts, "stale": stale, "time": time.time(),
            "lag_mean": sum(lags) / len(lags) if lags else None,
            "lag_max": max(lags, default=None),
            **self.window.summary(),
        }
        self.window = Window()
        if domain_scales:
            record["domain_scales"] = dict(domain_scales)
        if result is not None:
            record.update(loss=result.loss, grad_norm=result.grad_norm, tokens=result.tokens,
                          seconds=result.seconds, **result.stats)
            log.info("step %d: loss %.4f grad %.3f tokens %d (%.0f tok/s) stale %d groups %s", self.lineage.step,
                     result.loss, result.grad_norm, result.tokens, result.tokens / max(result.seconds, 1e-9),
                     stale, record["groups"])
        ckpt.append_step_log(step_log_dir(self.config), record)


def step_decisions(deliveries: Sequence[Delivery[GroupAdvantaged]], lags: Sequence[int], learner_version: int,
                   produced: int | None, bound: int) -> list[Decision]:
    """Each group's decision in a step: ``trained`` (some rollout was in the step, which produced
    version ``produced``) or ``stale`` (every rollout older than ``bound`` allows, or no step ran);
    a group with stale rollouts is logged with its versions."""
    decisions, at = [], 0
    for delivery in deliveries:
        group = delivery.event
        group_lags = lags[at:at + len(group.rollouts)]
        at += len(group.rollouts)
        stale = sum(lag > bound for lag in group_lags)
        reason = ""
        if stale:
            firsts = sorted({r.rollout.policy_version_first for r in group.rollouts})
            reason = (f"{stale} of {len(group_lags)} rollouts stale: generated at policy version(s) {firsts}, "
                      f"learner at version {learner_version} before this step, max_staleness {bound}")
            log.warning("dropped %s of group %s", reason, group.group_id)
        if produced is not None and stale < len(group_lags):
            decisions.append(Decision(delivery, "trained", reason, produced, trained=len(group_lags) - stale,
                                      stale=stale))
        else:
            decisions.append(Decision(delivery, "stale", reason, stale=stale))
    return decisions
