"""The learner's intake: groups from ``advantages`` into a step's buffer, each group that no step
will train decided on arrival.

A group is buffered for a step unless it is a **duplicate** (this lineage already consumed it, or
it waits in the buffer), **invalid** (a token id outside the model's vocabulary would crash the
forward pass, and the step's other groups with it, on every restart) or **filtered** by the
stream; those are recorded through the ledger (learner/ledger.py) as soon as they are seen, so
their capacity goes back to the sampler at once. While a step trains, :meth:`Intake.polled`
keeps the consumer polled (paused once a step's worth is buffered), so a long step never counts
as a dead consumer (``max.poll.interval``) and nothing piles up unboundedly.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rollstream.kafka import Delivery, EventConsumer
from rollstream.learner.ledger import Decision, Ledger
from rollstream.learner.setup import Lineage
from rollstream.schemas.events import GroupAdvantaged

log = logging.getLogger(__name__)
T = TypeVar("T")


class Intake:
    """The step buffer of one lineage: ``per_step`` groups at a time, in arrival order."""

    def __init__(self, consumer: EventConsumer[GroupAdvantaged], lineage: Lineage, ledger: Ledger, per_step: int,
                 vocab: Callable[[], int]) -> None:
        self.consumer, self.lineage, self.ledger, self.per_step = consumer, lineage, ledger, per_step
        self._vocab_of, self._vocab = vocab, 0
        self.buffer: deque[Delivery[GroupAdvantaged]] = deque()
        self.unstepped: list[Decision] = []  # decided on arrival (filtered, duplicate, invalid): recorded, not trained

    async def next_groups(self) -> list[Delivery[GroupAdvantaged]] | None:
        """A step's groups, once buffered (None meanwhile); groups decided on arrival are recorded."""
        await self.fill()
        if self.unstepped:
            await self.settle_unstepped()
        if len(self.buffer) < self.per_step:
            return None
        return [self.buffer.popleft() for _ in range(self.per_step)]

    async def fill(self) -> None:
        """Poll until a step's groups are buffered (or a poll comes back empty)."""
        while len(self.buffer) < self.per_step:
            got = await self.consumer.getmany(max_records=self.per_step - len(self.buffer), timeout_s=0.5)
            if not got:
                return
            self.accept(got)

    def accept(self, deliveries: list[Delivery[GroupAdvantaged]]) -> None:
        """Buffer new groups; decide at once those no step will train (recorded by
        :meth:`settle_unstepped`)."""
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

    def invalid_reason(self, group: GroupAdvantaged) -> str | None:
        """Why the model cannot train on ``group`` at all (None: it can)."""
        vocab = self._vocab = self._vocab or self._vocab_of()
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

    async def polled(self, work: Awaitable[T]) -> T:
        """Await ``work`` while keeping the consumer polled (paused while a step's worth waits)."""
        task: asyncio.Future[Any] = asyncio.ensure_future(work)
        raw = self.consumer.raw
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                if task.done():
                    break
                if len(self.buffer) >= self.per_step:
                    raw.pause(*raw.assignment())
                else:
                    raw.resume(*raw.paused())
                wanted = max(1, self.per_step - len(self.buffer))
                self.accept(await self.consumer.getmany(max_records=wanted, timeout_s=0.05))
        finally:
            raw.resume(*raw.paused())
        return task.result()
