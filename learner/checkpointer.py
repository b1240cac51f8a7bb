"""When and how the learner checkpoints: after a step that trained, every ``checkpoint.every``
steps or at each ``checkpoint.every_minutes`` mark, and once more on the way out.

A checkpoint holds, per partition of ``advantages``, the lineage's next offset; the offsets are
committed to Kafka only after it is written, so committed offsets never run ahead of a
checkpoint. Two formats: the single-process one (learner/checkpoint.py: one process and a local
directory) and the sharded one (learner/sharded_checkpoint.py: several ranks or a URL).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rollstream.config import Config
from rollstream.kafka import EventConsumer
from rollstream.learner import checkpoint as ckpt
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.lora import merged_state_dict
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.setup import Lineage
from rollstream.schemas.events import GroupAdvantaged

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, config: Config, trainer: Any, tokenizer: Any, lineage: Lineage,
                 consumer: EventConsumer[GroupAdvantaged], metrics: LearnerMetrics) -> None:
        self.config, self.trainer, self.tokenizer, self.lineage = config, trainer, tokenizer, lineage
        self.consumer, self.metrics = consumer, metrics
        self.written = (lineage.step, lineage.groups_consumed)  # what the newest checkpoint holds
        every_s = config.learner.checkpoint.every_minutes * 60
        self.next_timed = time.monotonic() + every_s if every_s else None  # the next wall-clock mark

    @property
    def behind(self) -> bool:
        """Has the lineage moved since the newest checkpoint?"""
        return self.written != (self.lineage.step, self.lineage.groups_consumed)

    def due(self) -> bool:
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

    async def save(self) -> None:
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
        self.written = (self.lineage.step, self.lineage.groups_consumed)
        self.metrics.checkpoints.inc()
        log.info("checkpoint %s (offsets %s)", path, offsets)
