"""The learner stage: ``advantages`` in, a trained policy out (weight store + ``policy`` topic).

Consumes ``GroupAdvantaged`` (consumer group ``<topic prefix>learner``; one learner process per run). Every
``rl.groups_per_step`` groups, in arrival order, make one step: rollouts staler than
``rl.max_staleness`` are dropped and counted, the rest are trained on (learner/trainer.py), and
the policy version advances by one. Version numbers are never reused: a learner that starts
(fresh or resumed) while the weight store holds version V continues at V + 1 and publishes its
weights at once, so generators, which only ever move to a newer version, switch to this
lineage's weights instead of keeping a dead or earlier run's. Every ``broadcast_every`` steps
the weights are published to the weight store, the version is set in Redis and a
``WeightsPublished`` goes to ``policy``. After each step ``progress:groups_consumed`` is set.

Exactly once per lineage: a group's offset is marked done only once the step that used it has
run, and offsets are committed to Kafka only right after a checkpoint holding them was written.
The checkpoint stores, per partition of ``advantages``, the next offset of the lineage; ``resume``
seeks there (not to the committed offsets, which may lag), so after a crash every group after
the checkpoint is trained exactly once more and none before it again. Duplicates of a group the
lineage already consumed (an upstream replay) are skipped by ``group_id``.

Every group consumed gets one ``GroupFate`` on ``fates`` (trained at which step and version, or
dropped as stale with its versions, filtered, or a duplicate), acknowledged before the group's
offset is marked done: the one record of each group's fate that the archive, ``rollstream
inspect``, ``rollstream runs`` and accounting read.

SIGTERM/SIGINT: finish the running step, checkpoint, commit, exit 0. ``steps.jsonl`` in the
checkpoint directory records, per step, the run id, the group ids and the step's metrics.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import uuid
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollstream.config import Config
from rollstream.infra import resolve_endpoints
from rollstream.kafka import Delivery, EventConsumer, EventProducer, ensure_topics
from rollstream.learner import checkpoint as ckpt
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.batch import select_rollouts
from rollstream.learner.distributed import Leader, Ranks, device_figures, init_ranks, serve, shutdown
from rollstream.learner.lora import merged_state_dict
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.publish import PeakRSS, iterate_in_thread
from rollstream.learner.setup import RECENT_GROUPS, Lineage, RecentIds, build_trainer  # noqa: F401 (re-exported)
from rollstream.learner.trainer import Trainer
from rollstream.lifecycle import stop_event
from rollstream.metrics import StageMetrics, serve_metrics
from rollstream.redis import connect, count_outcomes, set_groups_consumed, set_policy_version
from rollstream.schemas.events import GroupAdvantaged, GroupFate
from rollstream.schemas.stages import consumer_group
from rollstream.weight_files import open_weight_store
from rollstream.weights import WeightStore

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


async def run(config: Config, resume: bool = False) -> None:
    """Run the learner until ``max_steps``, SIGTERM or SIGINT; ``resume`` continues from ``latest``.

    Under a launcher (torchrun, WORLD_SIZE > 1) every rank calls this: rank 0 runs the stage,
    the others train their shares (learner/distributed.py). A rank restarted by the launcher
    always resumes."""
    c = config.learner
    ranks = init_ranks(c)
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and not resume:
        log.warning("restarted by the launcher (restart %s): resuming from the last checkpoint",
                    os.environ["TORCHELASTIC_RESTART_COUNT"])
        resume = True
    settle = False  # meet the other ranks at a barrier on the way out: only once they were told to stop
    try:
        resume_from = agree(ranks, sharded_ckpt.latest_checkpoint(c.checkpoint.dir) if resume else None)
        if resume and resume_from is None:
            log.warning("--resume: no checkpoint in %s; starting a new lineage", c.checkpoint.dir)
        trainer, tokenizer, lineage, offsets = await asyncio.to_thread(build_trainer, config, resume_from, ranks)
        if ranks is not None and not ranks.leader:
            serve(trainer, ranks)  # blocking, in the main thread (it sets signal handlers): nothing else runs here
            settle = True
            return
        leader = Leader(trainer, ranks) if ranks is not None else trainer
        try:
            await run_stage(config, leader, tokenizer, lineage, offsets, resume_from)
        finally:
            if ranks is not None:
                leader.close()  # the other ranks stop serving and meet this one at the barrier
            settle = True
    finally:
        shutdown(ranks, settle=settle)


def agree(ranks: Ranks | None, resume_from: str | None) -> str | None:
    """Rank 0's choice of checkpoint, for every rank (they must all load the same one)."""
    if ranks is None:
        return resume_from
    from rollstream.learner.distributed import Command, receive, send

    if ranks.leader:
        send(ranks, Command(op="resume", path=resume_from or ""))
        return resume_from
    return receive(ranks).path or None


async def run_stage(config: Config, trainer: Any, tokenizer: Any, lineage: Lineage, offsets: dict[int, int],
                    resume_from: str | None) -> None:
    """Rank 0 (or the only rank): Kafka, Redis, the loop."""
    c = config.learner
    run_id = uuid.uuid4().hex[:12]
    log.info("learner run %s: step %d, version %d, from %s, offsets %s", run_id, lineage.step, lineage.version,
             resume_from or c.model, offsets)
    stage_metrics = StageMetrics("learner")
    metrics = LearnerMetrics(stage_metrics)
    serve_metrics(c.metrics_port, stage_metrics)
    endpoints = resolve_endpoints(config)
    stop = stop_event()
    async with AsyncExitStack() as stack:
        redis = connect(endpoints.redis_url)
        stack.push_async_callback(redis.aclose)
        store = open_weight_store(redis, key_prefix=config.infra.key_prefix, settings=config.weights)
        await ensure_topics(config.infra, ["advantages", "policy", "fates"])
        producer = await stack.enter_async_context(
            EventProducer(config.infra, client_id=f"learner-{run_id}", metrics=stage_metrics, stage="learner"))
        consumer = await stack.enter_async_context(EventConsumer(
            config.infra, "advantages", group_id=consumer_group(config.infra.topic_prefix, "learner"), producer=producer,
            stage="learner",
            metrics=stage_metrics, start_offsets=offsets, max_poll_records=max(1, config.rl.groups_per_step)))
        loop = LearnerLoop(config, trainer, tokenizer, lineage, consumer, producer, store, redis, metrics, run_id)
        newest = await store.latest_version()
        if newest is not None and newest >= lineage.version:
            log.info("the weight store holds version %d from an earlier learner; this lineage continues at %d",
                     newest, newest + 1)
            lineage.version = newest + 1
        if resume_from is not None or newest is not None:  # generators must serve this lineage's weights
            await loop.publish()
        else:
            await set_policy_version(redis, config.infra, lineage.version)
        await set_groups_consumed(redis, config.infra, lineage.groups_consumed)
        await loop.run(stop)


class LearnerLoop:
    """Fetch, step, broadcast, checkpoint: the stage's one loop (state lives in ``lineage``)."""

    def __init__(self, config: Config, trainer: Trainer, tokenizer: Any, lineage: Lineage,
                 consumer: EventConsumer[GroupAdvantaged], producer: EventProducer, store: WeightStore,
                 redis: Any, metrics: LearnerMetrics, run_id: str) -> None:
        self.config, self.trainer, self.tokenizer, self.lineage = config, trainer, tokenizer, lineage
        self.consumer, self.producer, self.store, self.redis = consumer, producer, store, redis
        self.metrics, self.run_id = metrics, run_id
        self.buffer: deque[Delivery[GroupAdvantaged]] = deque()
        self.checkpointed = (lineage.step, lineage.groups_consumed)
        every_s = config.learner.checkpoint.every_minutes * 60
        self.next_timed = time.monotonic() + every_s if every_s else None  # the next wall-clock checkpoint
        # Groups trained into a version not yet published: their sampler capacity is held back
        # until it is, or the sampler's next groups would be generated with the old weights.
        self.unpublished = 0
        self.window = Window()  # every group resolved since the last step's record
        self.filtered: list[Delivery[GroupAdvantaged]] = []  # arrived flagged: recorded, not trained
        self.duplicates: list[Delivery[GroupAdvantaged]] = []  # already consumed by this lineage: skipped
        self.invalid: list[tuple[Delivery[GroupAdvantaged], str]] = []  # cannot be trained: dead-lettered
        self._vocab: int | None = None
        # learner.overlap_publish (one rank): the publish runs as a task while the next step's
        # forward and backward run; the step's optimizer update waits for ``weights_free``.
        self.overlap = config.learner.overlap_publish and isinstance(trainer, Trainer) and trainer.ranks is None
        self.publishing: asyncio.Task[None] | None = None
        self.weights_free = threading.Event()
        self.weights_free.set()
        if self.overlap:
            trainer.before_update = self.weights_free.wait

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.loop(stop)
        finally:
            if self.publishing is not None and not self.publishing.done():  # failing: do not leave it behind
                self.publishing.cancel()
                await asyncio.gather(self.publishing, return_exceptions=True)
        log.info("learner run %s stopped at step %d (version %d)", self.run_id, self.lineage.step,
                 self.lineage.version)

    async def loop(self, stop: asyncio.Event) -> None:
        c, per_step = self.config.learner, self.config.rl.groups_per_step
        while not stop.is_set() and not (c.max_steps and self.lineage.step >= c.max_steps):
            if self.publishing is not None and self.publishing.done():
                await self.publish_done()  # raises what failed it
            await self.fill(per_step)
            if self.filtered or self.duplicates or self.invalid:
                await self.settle_unstepped()
            if len(self.buffer) < per_step:
                continue
            groups = [self.buffer.popleft() for _ in range(per_step)]
            trained = await self.consume(groups)
            if trained:
                self.unpublished += len(groups)
                if self.lineage.step % c.broadcast_every == 0:
                    await self.publish(overlap=self.overlap)
            await self.release()
            if trained and (c.checkpoint.every and self.lineage.step % c.checkpoint.every == 0 or self.timed_due()):
                await self.checkpoint()
        await self.publish_done()
        if self.checkpointed != (self.lineage.step, self.lineage.groups_consumed):
            await self.checkpoint()

    def timed_due(self) -> bool:
        """learner.checkpoint.every_minutes: has the step just taken ended past the next mark?"""
        if self.next_timed is None or time.monotonic() < self.next_timed:
            return False
        every_s = self.config.learner.checkpoint.every_minutes * 60
        while self.next_timed <= time.monotonic():  # a mark passed during a long step is not made up
            self.next_timed += every_s
        return True

    async def fill(self, wanted: int) -> None:
        """Poll until ``wanted`` groups are buffered (or a poll comes back empty)."""
        while len(self.buffer) < wanted:
            got = await self.consumer.getmany(max_records=wanted - len(self.buffer), timeout_s=0.5)
            if not got:
                return
            self.accept(got)

    def accept(self, deliveries: list[Delivery[GroupAdvantaged]]) -> None:
        """Buffer new groups; a group this lineage already has waits, as a duplicate, for
        :meth:`settle_unstepped` (recorded, skipped), as does one the stream flagged as filtered."""
        for delivery in deliveries:
            group_id = delivery.event.group_id
            if group_id in self.lineage.recent or any(d.event.group_id == group_id
                                                      for d in (*self.buffer, *self.filtered)):
                log.warning("skipping duplicate group %s (%s[%d]@%d)", group_id, delivery.topic,
                            delivery.partition, delivery.offset)
                self.duplicates.append(delivery)
                continue
            reason = self.invalid_reason(delivery.event)
            if reason is not None:
                log.warning("group %s cannot be trained: %s", group_id, reason)
                self.invalid.append((delivery, reason))
                continue
            (self.filtered if delivery.event.filtered else self.buffer).append(delivery)

    @property
    def vocab(self) -> int:
        if self._vocab is None:
            self._vocab = self.trainer.model.get_input_embeddings().num_embeddings
        return self._vocab

    def invalid_reason(self, group: GroupAdvantaged) -> str | None:
        """Why the model cannot train on ``group`` at all (a token id outside its vocabulary would
        crash the forward pass, and the step's other groups with it, on every restart)."""
        vocab = self.vocab
        for item in group.rollouts:
            r = item.rollout
            top = max(max(r.prompt_token_ids, default=0), max(r.completion_token_ids, default=0))
            if top >= vocab:
                return (f"invalid: rollout {r.rollout_id} has token id {top}, outside the model's vocabulary "
                        f"of {vocab}")
        return None

    async def settle_unstepped(self) -> None:
        """Groups no step will train: those with nothing to train on (e.g. zero variance), and
        duplicates of groups this lineage already consumed. Their fates are published, they are
        counted and marked done, and a filtered group's capacity is freed at once."""
        filtered, self.filtered = self.filtered, []
        duplicates, self.duplicates = self.duplicates, []
        invalid, self.invalid = self.invalid, []
        version, step = self.lineage.version, self.lineage.step
        fates = [self.fate(d, "filtered", d.event.filtered, step, version, version) for d in filtered]
        fates += [self.fate(d, "duplicate", "this lineage already consumed the group", step, version, version)
                  for d in duplicates]
        fates += [self.fate(d, "invalid", reason, step, version, version) for d, reason in invalid]
        for delivery, reason in invalid:  # with its bytes, for whoever fixes the producer
            await self.producer.dead_letter(delivery, reason, stage="learner")
        await self.producer.send_many([("fates", fate) for fate in fates])
        for delivery in filtered:
            self.window.add(delivery.event)
            self.metrics.observe_group(delivery.event)
            log.debug("group %s filtered by the stream (%s): recorded, not trained", delivery.event.group_id,
                      delivery.event.filtered)
        invalid_deliveries = [d for d, _ in invalid]
        for delivery in (*filtered, *duplicates, *invalid_deliveries):
            self.consumer.done(delivery)
        self.lineage.recent.extend(d.event.group_id for d in (*filtered, *invalid_deliveries))
        self.lineage.groups_consumed += len(filtered) + len(invalid)  # resolved: the sampler's capacity is freed
        if filtered:
            self.metrics.groups.labels("filtered").inc(len(filtered))
            await count_outcomes(self.redis, self.config.infra, {"filtered": len(filtered)})
        if duplicates:
            self.metrics.groups.labels("duplicate").inc(len(duplicates))
        if invalid:
            self.metrics.groups.labels("invalid").inc(len(invalid))
        await self.release()

    def fate(self, delivery: Delivery[GroupAdvantaged], fate: str, reason: str, step: int, version: int,
             learner_version: int, *, trained: int = 0, stale: int = 0) -> GroupFate:
        group = delivery.event
        return GroupFate(
            group_id=group.group_id, task_id=group.task_id, family=group.family, fate=fate, reason=reason[:4096],
            step=step, policy_version=version, learner_version=learner_version, rollouts=len(group.rollouts),
            rollouts_trained=trained, rollouts_stale=stale,
            behaviour_versions=sorted({r.rollout.policy_version_first for r in group.rollouts})[:1024],
            learner_run=self.run_id, source_partition=delivery.partition, source_offset=delivery.offset,
            decided_at=time.time(), excluded=group.excluded)

    async def consume(self, deliveries: list[Delivery[GroupAdvantaged]]) -> bool:
        """Train one step on ``deliveries`` (unless all of it is stale); returns whether a step ran."""
        groups = [d.event for d in deliveries]
        version = self.lineage.version
        selection = select_rollouts(groups, version, self.config.rl.max_staleness)
        self.metrics.observe_rollouts(selection.lags, len(selection.rollouts), selection.stale, selection.empty)
        result = None
        if selection.rollouts:
            # In a thread: the event loop keeps the consumer's heartbeats and metrics alive meanwhile.
            result = await self.run_polling(asyncio.to_thread(self.trainer.step, selection.rollouts))
            self.lineage.step += 1
            self.lineage.version += 1
            self.metrics.observe_step(result.loss, result.grad_norm, result.tokens, result.seconds, result.lr,
                                      result.stats, self.lineage.version)
            self.metrics.observe_ranks(result.ranks if result.ranks is not None else [
                {"step_seconds": result.seconds, "allreduce_seconds": 0.0,
                 **device_figures(torch.device(self.config.learner.device))}])
        self.lineage.groups_consumed += len(groups)
        self.lineage.recent.extend(g.group_id for g in groups)
        for group in groups:
            self.window.add(group)
            self.metrics.observe_group(group, version)
        fates = self.step_fates(deliveries, selection.lags, version, result is not None)
        outcomes = {"trained": 0, "stale": 0}
        for fate in fates:
            outcomes[fate.fate] += 1
        await self.producer.send_many([("fates", fate) for fate in fates])  # before done: never a fate lost
        for outcome, count in outcomes.items():
            self.metrics.groups.labels(outcome).inc(count)
        await count_outcomes(self.redis, self.config.infra, outcomes)
        for delivery in deliveries:
            self.consumer.done(delivery)
        record: dict[str, Any] = {
            "run_id": self.run_id, "step": self.lineage.step, "policy_version": self.lineage.version,
            "groups_consumed": self.lineage.groups_consumed,
            "trained": result is not None, "groups": [g.group_id for g in groups],
            "rollouts": len(selection.rollouts), "stale": selection.stale, "time": time.time(),
            "lag_mean": sum(selection.lags) / len(selection.lags) if selection.lags else None,
            "lag_max": max(selection.lags, default=None),
            **self.window.summary(),
        }
        self.window = Window()
        if result is not None:
            record.update(loss=result.loss, grad_norm=result.grad_norm, tokens=result.tokens,
                          seconds=result.seconds, **result.stats)
            log.info("step %d: loss %.4f grad %.3f tokens %d (%.0f tok/s) stale %d groups %s", self.lineage.step,
                     result.loss, result.grad_norm, result.tokens, result.tokens / max(result.seconds, 1e-9),
                     selection.stale, record["groups"])
        ckpt.append_step_log(step_log_dir(self.config), record)
        return result is not None

    def step_fates(self, deliveries: list[Delivery[GroupAdvantaged]], lags: list[int], version: int,
                   stepped: bool) -> list[GroupFate]:
        """Each group's fate in this step: ``trained`` (some rollout trained) or ``stale`` (every
        rollout older than ``max_staleness`` allows); each group with stale rollouts is logged
        with its versions."""
        bound = self.config.rl.max_staleness
        fates, at = [], 0
        for delivery in deliveries:
            group = delivery.event
            group_lags = lags[at:at + len(group.rollouts)]
            at += len(group.rollouts)
            stale = sum(lag > bound for lag in group_lags)
            reason = ""
            if stale:
                firsts = sorted({r.rollout.policy_version_first for r in group.rollouts})
                reason = (f"{stale} of {len(group_lags)} rollouts stale: generated at policy version(s) {firsts}, "
                          f"learner at version {version} before this step, max_staleness {bound}")
                log.warning("dropped %s of group %s", reason, group.group_id)
            trained = stepped and stale < len(group_lags)
            fates.append(self.fate(
                delivery, "trained" if trained else "stale", reason, self.lineage.step,
                self.lineage.version if trained else version, version, trained=len(group_lags) - stale if trained else 0,
                stale=stale))
        return fates

    async def release(self) -> None:
        """Tell the sampler which groups are resolved: all consumed but those trained into a
        version not yet published."""
        await set_groups_consumed(self.redis, self.config.infra, self.lineage.groups_consumed - self.unpublished)

    async def run_polling(self, work: Any) -> Any:
        """Await ``work`` while keeping the consumer polled (paused), so a long step never counts
        as a dead consumer (max.poll.interval) and nothing piles up unboundedly."""
        task = asyncio.ensure_future(work)
        raw = self.consumer.raw
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                if task.done():
                    break
                if len(self.buffer) >= self.config.rl.groups_per_step:
                    raw.pause(*raw.assignment())
                else:
                    raw.resume(*raw.paused())
                wanted = max(1, self.config.rl.groups_per_step - len(self.buffer))
                self.accept(await self.consumer.getmany(max_records=wanted, timeout_s=0.05))
        finally:
            raw.resume(*raw.paused())
        return task.result()

    async def publish(self, overlap: bool = False) -> None:
        """Publish this version's weights; ``overlap``: start it as a task and return (the next
        step trains meanwhile and waits for it before changing a weight). One publish at a time."""
        await self.publish_done()
        if not overlap:
            await self.publish_now()
            return
        self.weights_free.clear()

        async def publish_then_release() -> None:
            try:
                await self.publish_now()
            finally:
                self.weights_free.set()
            await self.release()

        self.publishing = asyncio.create_task(publish_then_release())

    async def pin_for_evaluator(self, version: int) -> None:
        """Keep ``version`` in the weight store for the evaluator (it unpins it once read), unless
        ``eval.max_pinned`` versions already wait: then it expires as usual and the evaluator
        reports it skipped. Best effort: a failure here never stops training."""
        try:
            if len(await self.store.pinned()) < self.config.eval.max_pinned:
                await self.store.pin(version)
            else:
                log.warning("version %d is not kept for the evaluator: %d versions already wait for it", version,
                            self.config.eval.max_pinned)
        except Exception as exc:  # noqa: BLE001 (the evaluator then reports the version skipped)
            log.warning("could not keep version %d for the evaluator: %s", version, exc)

    async def publish_done(self) -> None:
        """Wait for an overlapped publish (its failure is raised here)."""
        task, self.publishing = self.publishing, None
        if task is not None:
            await task

    async def publish_now(self) -> None:
        """Stream the weights to the store one tensor at a time (gathered across the ranks, LoRA
        merged, cast to ``broadcast_dtype``): the publishing rank holds a tensor (Redis store) or
        one file's worth (file store) besides the model; its peak extra memory is measured."""
        started = time.perf_counter()
        c = self.config.learner
        dtype = getattr(torch, c.broadcast_dtype)
        base = getattr(self.trainer.model, "get_base_model", lambda: self.trainer.model)()
        files = {"config.json": base.config.to_json_string().encode()}
        version = self.lineage.version
        if self.config.eval.evaluates(version, self.config.learner.max_steps):
            await self.pin_for_evaluator(version)
        with PeakRSS() as peak:
            published = await self.store.publish_stream(
                self.lineage.version, iterate_in_thread(lambda: self.trainer.named_weights(dtype)),
                step=self.lineage.step, files=files)
        await self.producer.send("policy", published)
        await set_policy_version(self.redis, self.config.infra, self.lineage.version)
        self.unpublished = 0
        self.metrics.broadcast_seconds.observe(time.perf_counter() - started)
        self.metrics.publish_peak_extra.set(peak.extra_bytes)
        log.info("published policy version %d (%d bytes; the publish added %.1f MB at its peak)", published.version,
                 published.num_bytes, peak.extra_bytes / 1e6)

    async def checkpoint(self) -> None:
        offsets = dict(self.consumer.safe_offsets())
        for tp in self.consumer.raw.assignment():  # partitions never read: their current position
            if tp.partition not in offsets:
                offsets[tp.partition] = await self.consumer.raw.position(tp)
        state = ckpt.CheckpointState(
            step=self.lineage.step, policy_version=self.lineage.version, groups_consumed=self.lineage.groups_consumed,
            offsets=offsets, topic=self.consumer.topic, lora=self.config.learner.lora is not None,
            written_at=time.time())
        c = self.config.learner
        extra = {"recent_groups.txt": "\n".join(self.lineage.recent)}
        if getattr(self.trainer, "ranks", None) is not None or sharded_ckpt.is_url(c.checkpoint.dir):
            path = await asyncio.to_thread(
                sharded_ckpt.save_checkpoint, c.checkpoint.dir, state, self.trainer, tokenizer=self.tokenizer,
                keep=c.checkpoint.keep, shard_bytes=c.checkpoint.shard_bytes, extra_files=extra)
        else:  # one process, a local directory: the single-process format (learner/checkpoint.py)
            merged = None
            if c.lora is not None:
                merged = await asyncio.to_thread(merged_state_dict, self.trainer.model)
            path = await asyncio.to_thread(
                ckpt.save_checkpoint, c.checkpoint.dir, state, model=self.trainer.model, tokenizer=self.tokenizer,
                optimizer=self.trainer.optimizer, scheduler=self.trainer.scheduler, merged_weights=merged,
                keep=c.checkpoint.keep, extra_files=extra)
        await self.consumer.commit()  # only now: committed offsets never run ahead of a checkpoint
        self.checkpointed = (self.lineage.step, self.lineage.groups_consumed)
        self.metrics.checkpoints.inc()
        log.info("checkpoint %s (offsets %s)", path, offsets)
