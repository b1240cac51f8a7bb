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

Every group consumed is decided once, trained, filtered or dropped with a reason, and recorded by
the ledger (learner/ledger.py): its ``GroupFate`` on ``fates``, acknowledged before the group's
offset is marked done (the one record that the archive, ``rollstream inspect``, ``rollstream
runs`` and accounting read), then its counts.

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
from typing import Any

import torch

from rollstream.config import Config
from rollstream.kafka import Delivery, EventConsumer, EventProducer
from rollstream.learner import checkpoint as ckpt
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.batch import select_rollouts
from rollstream.learner.distributed import Leader, Ranks, device_figures, init_ranks, serve, shutdown
from rollstream.learner.ledger import Decision, Ledger, step_decisions, step_log_dir  # noqa: F401 (re-exported)
from rollstream.learner.lora import merged_state_dict
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.publish import PeakRSS, iterate_in_thread
from rollstream.learner.setup import RECENT_GROUPS, Lineage, RecentIds, build_trainer  # noqa: F401 (re-exported)
from rollstream.learner.trainer import Trainer
from rollstream.lifecycle import stop_event
from rollstream.redis import set_groups_consumed
from rollstream.schemas.events import GroupAdvantaged
from rollstream.stage_io import open_stage
from rollstream.weight_files import open_weight_store
from rollstream.weights import WeightStore, set_learner_version

log = logging.getLogger(__name__)


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
    stop = stop_event()
    async with open_stage(config, "learner", client_id=f"learner-{run_id}", start_offsets=offsets,
                          max_poll_records=max(1, config.rl.groups_per_step)) as io:
        redis, metrics = io.redis, LearnerMetrics(io.metrics)
        store = open_weight_store(redis, key_prefix=config.infra.key_prefix, settings=config.weights)
        assert io.consumer is not None
        loop = LearnerLoop(config, trainer, tokenizer, lineage, io.consumer, io.producer, store, redis, metrics, run_id)
        newest = await store.latest_version()
        if newest is not None and newest >= lineage.version:
            log.info("the weight store holds version %d from an earlier learner; this lineage continues at %d",
                     newest, newest + 1)
            lineage.version = newest + 1
        if resume_from is not None or newest is not None:  # generators must serve this lineage's weights
            await loop.publish()
        else:
            await set_learner_version(redis, config.infra.key_prefix, lineage.version)
        await set_groups_consumed(redis, config.infra, lineage.groups_consumed)
        await loop.run(stop)


class LearnerLoop:
    """The stage's recipe: take a step's groups, select, train, publish, record fates (the
    bookkeeping is the ledger's, learner/ledger.py; state lives in ``lineage``)."""

    def __init__(self, config: Config, trainer: Trainer, tokenizer: Any, lineage: Lineage,
                 consumer: EventConsumer[GroupAdvantaged], producer: EventProducer, store: WeightStore,
                 redis: Any, metrics: LearnerMetrics, run_id: str) -> None:
        self.config, self.trainer, self.tokenizer, self.lineage = config, trainer, tokenizer, lineage
        self.consumer, self.producer, self.store, self.redis = consumer, producer, store, redis
        self.metrics, self.run_id = metrics, run_id
        self.ledger = Ledger(config, lineage, consumer, producer, redis, metrics, run_id)
        self.buffer: deque[Delivery[GroupAdvantaged]] = deque()
        self.unstepped: list[Decision] = []  # decided on arrival (filtered, duplicate, invalid): recorded, not trained
        self.checkpointed = (lineage.step, lineage.groups_consumed)
        every_s = config.learner.checkpoint.every_minutes * 60
        self.next_timed = time.monotonic() + every_s if every_s else None  # the next wall-clock checkpoint
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
        c = self.config.learner
        while not stop.is_set() and not (c.max_steps and self.lineage.step >= c.max_steps):
            if self.publishing is not None and self.publishing.done():
                await self.publish_done()  # raises what failed it
            groups = await self.next_groups()
            if groups is None:
                continue
            trained = await self.step(groups)
            if trained and self.lineage.step % c.broadcast_every == 0:
                await self.publish(overlap=self.overlap)
            await self.ledger.release()
            if trained and self.checkpoint_due():
                await self.checkpoint()
        await self.publish_done()
        if self.checkpointed != (self.lineage.step, self.lineage.groups_consumed):
            await self.checkpoint()

    async def next_groups(self) -> list[Delivery[GroupAdvantaged]] | None:
        """A step's groups, once buffered (None meanwhile); groups decided on arrival are recorded."""
        per_step = self.config.rl.groups_per_step
        await self.fill(per_step)
        if self.unstepped:
            await self.settle_unstepped()
        if len(self.buffer) < per_step:
            return None
        return [self.buffer.popleft() for _ in range(per_step)]

    async def step(self, deliveries: list[Delivery[GroupAdvantaged]]) -> bool:
        """Select the rollouts fresh enough, train one step on them (unless all are stale), record
        every group's fate; returns whether a step ran."""
        groups = [d.event for d in deliveries]
        version = self.lineage.version
        selection = select_rollouts(groups, version, self.config.rl.max_staleness)
        self.metrics.observe_rollouts(selection.lags, len(selection.rollouts), selection.stale, selection.empty)
        result = await self.train(selection.rollouts) if selection.rollouts else None
        await self.ledger.decide(step_decisions(deliveries, selection.lags, version,
                                                self.lineage.version if result is not None else None,
                                                self.config.rl.max_staleness), version)
        self.ledger.log_step(groups, len(selection.rollouts), selection.lags, selection.stale, result)
        if result is not None:
            self.ledger.unpublished += len(groups)
        return result is not None

    async def train(self, rollouts: list[Any]) -> Any:
        """One optimizer step (in a thread: the event loop keeps the consumer's heartbeats and
        metrics alive meanwhile); the lineage moves to the version it produced."""
        result = await self.run_polling(asyncio.to_thread(self.trainer.step, rollouts))
        self.lineage.step += 1
        self.lineage.version += 1
        self.metrics.observe_step(result.loss, result.grad_norm, result.tokens, result.seconds, result.lr,
                                  result.stats, self.lineage.version)
        self.metrics.observe_ranks(result.ranks if result.ranks is not None else [
            {"step_seconds": result.seconds, "allreduce_seconds": 0.0,
             **device_figures(torch.device(self.config.learner.device))}])
        return result

    def checkpoint_due(self) -> bool:
        """After a step that trained: every ``checkpoint.every`` steps, or ``every_minutes``."""
        every = self.config.learner.checkpoint.every
        return bool(every) and self.lineage.step % every == 0 or self.timed_due()

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
        """Buffer new groups; decide at once those no step will train: a duplicate of a group this
        lineage already has, one the model cannot train on, one the stream flagged as filtered
        (recorded by :meth:`settle_unstepped`)."""
        for delivery in deliveries:
            group_id = delivery.event.group_id
            if group_id in self.lineage.recent or any(d.event.group_id == group_id for d in self.buffer) or any(
                    d.delivery.event.group_id == group_id for d in self.unstepped if d.fate != "duplicate"):
                log.warning("skipping duplicate group %s (%s[%d]@%d)", group_id, delivery.topic,
                            delivery.partition, delivery.offset)
                self.unstepped.append(Decision(delivery, "duplicate", "this lineage already consumed the group"))
                continue
            reason = self.invalid_reason(delivery.event)
            if reason is not None:
                log.warning("group %s cannot be trained: %s", group_id, reason)
                self.unstepped.append(Decision(delivery, "invalid", reason))
            elif delivery.event.filtered:
                log.debug("group %s filtered by the stream (%s): recorded, not trained", group_id,
                          delivery.event.filtered)
                self.unstepped.append(Decision(delivery, "filtered", delivery.event.filtered))
            else:
                self.buffer.append(delivery)

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
        """Record the groups decided on arrival; their capacity is freed at once."""
        decided, self.unstepped = self.unstepped, []
        await self.ledger.decide(decided, self.lineage.version)
        await self.ledger.release()

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
            await self.ledger.release()

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
        await set_learner_version(self.redis, self.config.infra.key_prefix, self.lineage.version)
        self.ledger.unpublished = 0
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
