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
import uuid
from typing import Any

import torch

from rollstream.config import Config
from rollstream.kafka import Delivery, EventConsumer, EventProducer
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.batch import select_rollouts
from rollstream.learner.checkpointer import Checkpointer
from rollstream.learner.distributed import Leader, Ranks, device_figures, init_ranks, serve, shutdown
from rollstream.learner.domains import normalise_by_domain
from rollstream.learner.intake import Intake
from rollstream.learner.ledger import Decision, Ledger, step_decisions, step_log_dir  # noqa: F401 (re-exported)
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.publish import Publisher
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
            await loop.publisher.publish()
        else:
            await set_learner_version(redis, config.infra.key_prefix, lineage.version)
        await set_groups_consumed(redis, config.infra, lineage.groups_consumed)
        await loop.run(stop)


class LearnerLoop:
    """The stage's recipe: take a step's groups (learner/intake.py), select the fresh rollouts,
    train, publish (learner/publish.py), checkpoint (learner/checkpointer.py), record every
    group's fate (learner/ledger.py). The lineage's state lives in ``lineage``."""

    def __init__(self, config: Config, trainer: Trainer, tokenizer: Any, lineage: Lineage,
                 consumer: EventConsumer[GroupAdvantaged], producer: EventProducer, store: WeightStore,
                 redis: Any, metrics: LearnerMetrics, run_id: str) -> None:
        self.config, self.trainer, self.lineage, self.metrics, self.run_id = config, trainer, lineage, metrics, run_id
        self.ledger = Ledger(config, lineage, consumer, producer, redis, metrics, run_id)
        self.intake = Intake(consumer, lineage, self.ledger, max(1, config.rl.groups_per_step),
                             vocab=lambda: trainer.model.get_input_embeddings().num_embeddings)
        overlap = config.learner.overlap_publish and isinstance(trainer, Trainer) and trainer.ranks is None
        self.publisher = Publisher(config, trainer, lineage, producer, store, redis, metrics, self.ledger,
                                   overlap=overlap)
        self.checkpointer = Checkpointer(config, trainer, tokenizer, lineage, consumer, metrics)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self.loop(stop)
        finally:
            await self.publisher.abandon()
        log.info("learner run %s stopped at step %d (version %d)", self.run_id, self.lineage.step,
                 self.lineage.version)

    async def loop(self, stop: asyncio.Event) -> None:
        c = self.config.learner
        while not stop.is_set() and not (c.max_steps and self.lineage.step >= c.max_steps):
            await self.publisher.check()  # raises what failed an overlapped publish
            groups = await self.intake.next_groups()
            if groups is None:
                continue
            trained = await self.step(groups)
            if trained and self.lineage.step % c.broadcast_every == 0:
                await self.publisher.publish(overlap=self.publisher.overlap)
            await self.ledger.release()
            if trained and self.checkpointer.due():
                await self.checkpointer.save()
        await self.publisher.done()
        if self.checkpointer.behind:
            await self.checkpointer.save()

    async def step(self, deliveries: list[Delivery[GroupAdvantaged]]) -> bool:
        """Select the rollouts fresh enough, train one step on them (unless all are stale), record
        every group's fate; returns whether a step ran."""
        groups = [d.event for d in deliveries]
        version = self.lineage.version
        selection = select_rollouts(groups, version, self.config.rl.max_staleness)
        self.metrics.observe_rollouts(selection.lags, len(selection.rollouts), selection.stale, selection.empty)
        # learner.domain_normalize: each domain's advantages on unit std over the step (learner/domains.py)
        rollouts, scales = normalise_by_domain(selection.rollouts, self.config.learner.domain_normalize)
        self.metrics.observe_domain_scales(scales)
        result = await self.train(rollouts) if rollouts else None
        await self.ledger.decide(step_decisions(deliveries, selection.lags, version,
                                                self.lineage.version if result is not None else None,
                                                self.config.rl.max_staleness), version)
        self.ledger.log_step(groups, len(selection.rollouts), selection.lags, selection.stale, result,
                             domain_scales=scales)
        if result is not None:
            self.ledger.unpublished += len(groups)
        return result is not None

    async def train(self, rollouts: list[Any]) -> Any:
        """One optimizer step (in a thread, the consumer kept polled meanwhile, so heartbeats and
        metrics stay alive); the lineage moves to the version it produced."""
        result = await self.intake.polled(asyncio.to_thread(self.trainer.step, rollouts))
        self.lineage.step += 1
        self.lineage.version += 1
        self.metrics.observe_step(result.loss, result.grad_norm, result.tokens, result.seconds, result.lr,
                                  result.stats, self.lineage.version)
        self.metrics.observe_ranks(result.ranks if result.ranks is not None else [
            {"step_seconds": result.seconds, "allreduce_seconds": 0.0,
             **device_figures(torch.device(self.config.learner.device))}])
        return result
