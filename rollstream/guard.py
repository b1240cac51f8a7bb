"""What a consuming stage checks before it spends work on a record: has this record already
crashed its owners too often (a poison record), and was this unit of work already done (a
duplicate)? Both are answered from Redis in one round trip per fetched batch.

* **Poison records.** A record's attempt counter
  (``<key_prefix>attempts:<topic>:<partition>:<offset>``) goes up when it is taken into
  processing and is deleted once its outputs are acknowledged. A record whose counter is not
  zero when it is fetched was taken before and never finished: its owner crashed, hung until it
  was stopped, or was killed. Such a *suspect* is processed alone (the executor lets the work
  in flight finish first; the generator gives it a batch of its own), its counter going up just
  before, so that a crash then is its own and not a neighbour's: a valid record that shared a
  batch with a poison one is counted once, never again. A record whose counter has reached
  ``infra.poison_attempts`` (default 3: one crash among others, two alone) is dead-lettered with
  its bytes (reason ``poison: ...``) instead of being tried again, so one record cannot
  crash-loop a stage. A dead-lettered record is not lost: it sits on the DLQ with its reason.
* **Duplicates.** A unit of work (the generator's group, the executor's rollout and turn) is
  marked done (``<key_prefix>done:<stage>:<topic>:<id>``, expiring after ``infra.dedupe_ttl_s``) only
  after its outputs were acknowledged. A record whose unit is already marked, such as a prompt
  redelivered because its owner died between the acknowledgement and the commit, or a
  producer's retry, is skipped: logged, counted, committed. Records that carry the header
  ``rollstream-replay`` bypass the check (an explicit replay wants the work done again).

Redis being unreachable never stops a stage: the guard then admits everything (at-least-once
still holds; downstream dedupes by rollout id), logs and counts the failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from rollstream.config import InfraConfig
from rollstream.metrics import StageMetrics

log = logging.getLogger(__name__)

REPLAY_HEADER = "rollstream-replay"
REDIS_ERRORS = (RedisError, OSError)
ATTEMPTS_TTL_S = 7 * 24 * 3600  # a counter left by a record that was never retried goes eventually
NEW, SUSPECT, DUPLICATE, POISON = "new", "suspect", "duplicate", "poison"
WARN_EVERY_S = 30.0

# KEYS: per delivery its done key and its attempts key. ARGV: dedupe on, attempts on, the attempts'
# TTL, then one '1'/'0' per delivery: whether it is a replay. Returns per delivery (done, attempts
# before this one); counts an attempt for a delivery that will run (not done, or a replay) and was
# not taken before (a suspect is counted when it is started alone).
ADMIT = """
local out = {}
for i = 1, #KEYS, 2 do
  local done = 0
  if ARGV[1] == '1' then done = redis.call('EXISTS', KEYS[i]) end
  local attempts = 0
  if ARGV[2] == '1' then
    attempts = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
    if attempts == 0 and (done == 0 or string.sub(ARGV[4], (i + 1) / 2, (i + 1) / 2) == '1') then
      redis.call('INCR', KEYS[i + 1])
      redis.call('EXPIRE', KEYS[i + 1], ARGV[3])
    end
  end
  out[#out + 1] = done
  out[#out + 1] = attempts
end
return out
"""
# KEYS: the done keys to set (ARGV[1] of them, expiring after ARGV[2] s), then attempts keys to delete.
FLUSH = """
local marks = tonumber(ARGV[1])
for i = 1, marks do redis.call('SET', KEYS[i], 1, 'EX', ARGV[2]) end
for i = marks + 1, #KEYS do redis.call('DEL', KEYS[i]) end
return #KEYS
"""


def is_replay(delivery: Any) -> bool:
    return any(name == REPLAY_HEADER for name, _ in (getattr(delivery, "headers", None) or ()))


class IntakeGuard:
    """One stage's poison-record and duplicate checks (see the module docstring)."""

    def __init__(self, redis: Any, infra: InfraConfig, stage: str, metrics: StageMetrics | None = None) -> None:
        self.redis = redis
        self.prefix = infra.key_prefix
        self.stage = stage
        self.max_attempts = infra.poison_attempts
        self.ttl_s = int(infra.dedupe_ttl_s)
        self._last_warning = 0.0
        self._finished: list[tuple[Any, str | None]] = []
        # One command per batch, whatever its size (a pipeline costs the client per command).
        self._admit = redis.register_script(ADMIT) if redis is not None else None
        self._flush = redis.register_script(FLUSH) if redis is not None else None
        self.skipped = self.failures = None
        if metrics is not None:
            self.skipped = metrics.counter("intake_skipped", "Records not processed: duplicate work or poison",
                                           ("stage", "reason"))
            self.failures = metrics.counter("intake_guard_errors", "Guard checks that could not reach Redis",
                                            ("stage",))

    def _attempts_key(self, delivery: Any) -> str:
        return f"{self.prefix}attempts:{delivery.topic}:{delivery.partition}:{delivery.offset}"

    def _done_key(self, delivery: Any, unit: str) -> str:
        # per input topic: a run on new topics (another topic prefix) starts with nothing done
        return f"{self.prefix}done:{self.stage}:{delivery.topic}:{unit}"

    async def admit(self, deliveries: Sequence[Any], units: Sequence[str]) -> list[str]:
        """Per delivery: NEW (process it), SUSPECT (taken before and never finished: process it
        alone, after :meth:`start_suspect`), DUPLICATE (its unit is done) or POISON (taken
        ``poison_attempts`` times). Counts an attempt for each NEW delivery."""
        if not deliveries:
            return []
        if not self.max_attempts and not self.ttl_s:
            return [NEW] * len(deliveries)
        keys = []
        for delivery, unit in zip(deliveries, units):
            keys += (self._done_key(delivery, unit), self._attempts_key(delivery))
        try:
            replays = "".join("1" if is_replay(d) else "0" for d in deliveries)
            replies = await self._admit(keys=keys, args=[int(bool(self.ttl_s)), int(bool(self.max_attempts)),
                                                         ATTEMPTS_TTL_S, replays])
        except REDIS_ERRORS as exc:  # Redis down or failing: process everything (at-least-once holds)
            self._failed("admit", exc)
            return [NEW] * len(deliveries)
        verdicts = []
        for index, delivery in enumerate(deliveries):
            done, attempts = int(replies[2 * index]), int(replies[2 * index + 1])
            if done and not is_replay(delivery):
                verdicts.append(DUPLICATE)
            elif self.max_attempts and attempts >= self.max_attempts:
                verdicts.append(POISON)
            else:
                verdicts.append(SUSPECT if attempts else NEW)
        return verdicts

    async def start_suspect(self, delivery: Any) -> None:
        """Count the attempt of a SUSPECT delivery that is about to be processed alone (so that
        a crash now is its own, not a neighbour's)."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.incr(self._attempts_key(delivery))
                pipe.expire(self._attempts_key(delivery), ATTEMPTS_TTL_S)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            self._failed("count an attempt", exc)

    async def screen(self, deliveries: Sequence[Any], units: Sequence[str], consumer: Any,
                     producer: Any) -> list[tuple[int, bool]]:
        """:meth:`admit`, then settle what is not to be processed: a duplicate is marked done on
        ``consumer``; a poison record is dead-lettered through ``producer`` with its bytes, then
        marked done. Returns ``(index, suspect)`` of the deliveries to process; a suspect must
        be processed alone, after :meth:`start_suspect`."""
        keep = []
        for index, verdict in enumerate(await self.admit(deliveries, units)):
            delivery = deliveries[index]
            if verdict in (NEW, SUSPECT):
                keep.append((index, verdict == SUSPECT))
                continue
            if verdict == POISON:
                await producer.dead_letter(delivery, self.poison_reason(), stage=self.stage)
            self.count(verdict, delivery, units[index])
            self.released(delivery)
            consumer.done(delivery)
        return keep

    def poison_reason(self) -> str:
        return (f"poison: taken into processing {self.max_attempts} times without finishing (its owners crashed, "
                f"hung or were stopped each time); dead-lettered instead of trying again")

    def count(self, verdict: str, delivery: Any, unit: str) -> None:
        """Log and count a record that is not processed."""
        if self.skipped is not None:
            self.skipped.labels(self.stage, verdict).inc()
        if verdict == DUPLICATE:
            log.info("%s: skipped %s[%d]@%d: %s was already done (a redelivery)", self.stage, delivery.topic,
                     delivery.partition, delivery.offset, unit)

    def finished(self, delivery: Any, unit: str) -> None:
        """``delivery``'s outputs are acknowledged: its unit is done and its attempts are
        forgotten at the next :meth:`flush` (call it before committing)."""
        self._finished.append((delivery, unit))

    def released(self, delivery: Any) -> None:
        """``delivery`` was admitted but will not be processed, and that is no failure (it was
        dead-lettered or skipped): its attempts are forgotten at the next :meth:`flush`."""
        self._finished.append((delivery, None))

    async def flush(self) -> None:
        """Write what :meth:`finished` and :meth:`released` noted, in one round trip. Losing it
        (a crash first) costs at most a redelivered record processed again."""
        if not self._finished:
            return
        noted, self._finished = self._finished, []
        if not self.max_attempts and not self.ttl_s:
            return
        marks = [self._done_key(d, unit) for d, unit in noted if unit is not None] if self.ttl_s else []
        forget = [self._attempts_key(delivery) for delivery, _ in noted] if self.max_attempts else []
        try:
            await self._flush(keys=marks + forget, args=[len(marks), max(1, self.ttl_s)])
        except REDIS_ERRORS as exc:
            self._failed("flush", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        if self.failures is not None:
            self.failures.labels(self.stage).inc()
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning("%s: intake guard could not %s (Redis: %s: %s); processing without it", self.stage, what,
                        type(exc).__name__, exc)
