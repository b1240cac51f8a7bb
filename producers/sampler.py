"""The prompt sampler stage: tasks -> ``prompts`` (one PromptIssued per group).

Consumes: the task sources (``sampler.sources``), the learner's progress in Redis
(``groups_resolved``) and, for adaptive sampling, ``advantages`` (own consumer group
``<topic prefix>sampler-{run_name}``). Produces: ``prompts``.

Guarantees:

* **Order.** Position ``p`` of epoch ``e`` issues the task ``epoch_plan(...)[p]``
  (producers/mixture.py) as group ``{run_name}-{e}-{p}``. The plan of an epoch depends only
  on the tasks, weights, seed, epoch and the adaptive snapshot taken when the epoch started,
  which is persisted, so it never changes once started.
* **Resumable.** After every acknowledged batch the sampler writes (epoch, position, seed)
  to ``{key_prefix}sampler:{run_name}:state`` and adds the batch to ``sampler:issued``.
  A restart continues at the persisted position: nothing is skipped; a crash between the
  broker's ack and that write re-issues at most one batch with the *same* group ids, which
  downstream stages drop as duplicates.
* **Backpressure.** Never more than ``(rl.max_staleness + 1) * rl.groups_per_step`` groups
  issued but not resolved (``issued - groups_resolved``); while at the cap it is paused and
  says so in the log and in ``rollstream_paused{stage="sampler"}``.
* **Intake.** Tasks are taken as ``rollstream tasks check`` left them (its report, by task
  digest): under ``intake.mode = "enforce"`` a task that failed a check, or was never checked,
  is quarantined, logged with its reasons and counted; under ``"warn"`` it is logged only.
* **Stops** after ``sampler.max_groups`` issued groups or ``sampler.epochs`` epochs (0 =
  never), or on SIGTERM, after the batch in flight is acknowledged and persisted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import msgspec
import redis.asyncio as aioredis

from rollstream.config import Config
from rollstream.errors import ConfigError
from rollstream.kafka import EventConsumer, EventProducer
from rollstream.metrics import StageMetrics
from rollstream.producers.mixture import AdaptiveStats, epoch_plan, family_probabilities, informative
from rollstream.redis import groups_resolved, key
from rollstream.schemas.events import GroupAdvantaged, Message, PromptIssued, RewardSpec, SamplingParams
from rollstream.schemas.tasks import TaskSpec
from rollstream.stage_io import open_stage
from rollstream.tasks.intake import apply_intake, load_report, report_path
from rollstream.tasks.sources import load_tasks, split_tasks
from rollstream.weights import learner_version

log = logging.getLogger(__name__)
PENDING_LIMIT = 100_000  # issued groups remembered for the adaptive "dropped by the stream" check


def max_in_flight(config: Config) -> int:
    return (config.rl.max_staleness + 1) * config.rl.groups_per_step


def state_key(config: Config) -> str:
    return key(config.infra, f"sampler:{config.sampler.run_name}:state")


def issued_key(config: Config) -> str:
    return key(config.infra, "sampler:issued")


def group_id(run_name: str, epoch: int, position: int) -> str:
    return f"{run_name}-{epoch}-{position}"


def issued_reward(task: TaskSpec, turn_penalty: float | None) -> RewardSpec:
    """The reward spec a task's prompts carry: the task's own, with the sampler's overrides and
    the task's reference solution (for the executor's reference check; the model never sees the
    spec)."""
    reward = task.issued_reward()
    return reward if turn_penalty is None else msgspec.structs.replace(reward, turn_penalty=turn_penalty)


def tasks_digest(tasks: list[TaskSpec]) -> str:
    return hashlib.sha256("\n".join(f"{t.task_id}\t{t.family}" for t in tasks).encode()).hexdigest()[:16]


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0
    seed: int = 0
    digest: str = ""


@dataclass
class Sampler:
    """Everything the issuing loop and the feedback loop share."""

    config: Config
    redis: aioredis.Redis
    tasks: list[TaskSpec]
    metrics: StageMetrics
    adaptive: AdaptiveStats
    state: SamplerState = field(default_factory=SamplerState)
    plan: list[int] = field(default_factory=list)
    pending: OrderedDict[str, str] = field(default_factory=OrderedDict)  # group id -> task id
    rewards: dict[str, RewardSpec] = field(default_factory=dict)  # task id -> the spec its prompts carry

    def __post_init__(self) -> None:
        families = Counter(t.family for t in self.tasks)
        cfg = self.config.sampler
        self.probabilities = family_probabilities(families, cfg.family_weights, cfg.family_temperature)
        self.index_of = {t.task_id: i for i, t in enumerate(self.tasks)}
        self.family_of = {t.task_id: t.family for t in self.tasks}
        m = self.metrics
        self.issued_total = m.counter("sampler_issued", "Groups issued", ("family",))
        self.in_flight = m.gauge("sampler_in_flight", "Groups issued and not yet resolved by the learner")
        self.epoch_gauge = m.gauge("sampler_epoch", "Current epoch")
        self.position_gauge = m.gauge("sampler_position", "Next position in the epoch")
        self.feedback = m.counter("sampler_feedback_groups", "Groups seen on advantages", ("family", "informative"))
        self.family_score = m.gauge("sampler_family_informative", "Mean informative fraction per family", ("family",))
        self.family_probability = m.gauge("sampler_family_probability", "Mixture probability per family", ("family",))
        for family, p in self.probabilities.items():
            self.family_probability.labels(family).set(p)

    async def load_state(self) -> None:
        raw = await self.redis.hgetall(state_key(self.config))
        digest = tasks_digest(self.tasks)
        if not raw:
            self.state = SamplerState(seed=self.config.rl.seed, digest=digest)
        else:
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            self.state = SamplerState(int(fields["epoch"]), int(fields["position"]), int(fields["seed"]),
                                      fields.get("digest", ""))
            if self.state.seed != self.config.rl.seed:
                log.warning("resuming with the persisted seed %d (config says %d)", self.state.seed, self.config.rl.seed)
            if self.state.digest != digest:
                log.warning("the task set changed since the persisted position (digest %s -> %s): "
                            "the current epoch's plan is rebuilt", self.state.digest, digest)
                self.state.digest = digest
            log.info("resuming run %s at epoch %d position %d", self.config.sampler.run_name,
                     self.state.epoch, self.state.position)
        await self.start_epoch()
        if self.state.position >= len(self.plan):  # the task set shrank under a persisted position
            self.state.epoch, self.state.position = self.state.epoch + 1, 0
            await self.start_epoch()

    async def start_epoch(self) -> None:
        """Build the plan of the current epoch from its persisted (or now taken) adaptive snapshot."""
        snap_key = key(self.config.infra, f"sampler:{self.config.sampler.run_name}:epoch:{self.state.epoch}:scores")
        snapshot = self.adaptive.snapshot() if self.config.sampler.adaptive else {}
        await self.redis.set(snap_key, json.dumps(snapshot), nx=True)
        stored = json.loads(await self.redis.get(snap_key))
        if not self.adaptive.snapshot() and stored:  # restarted: seed the statistics from the snapshot
            self.adaptive.restore(stored)
        scores = {self.index_of[t]: s for t, s in stored.items() if t in self.index_of}
        self.plan = epoch_plan([t.family for t in self.tasks], self.probabilities, seed=self.state.seed,
                               epoch=self.state.epoch, scores=scores,
                               strength=self.config.sampler.adaptive_strength if self.config.sampler.adaptive else 0.0)
        self.epoch_gauge.set(self.state.epoch)

    def event(self, position: int, policy_version: int) -> PromptIssued:
        task = self.tasks[self.plan[position]]
        messages = task.chat()
        if self.config.sampler.system_prompt and not any(m.role == "system" for m in messages):
            messages = [Message(role="system", content=self.config.sampler.system_prompt), *messages]
        s = self.config.sampler
        reward = self.rewards.get(task.task_id)
        if reward is None:  # once per task: its overrides, and its reference for the executor's checks
            reward = self.rewards[task.task_id] = issued_reward(task, s.turn_penalty)
        return PromptIssued(
            group_id=group_id(self.config.sampler.run_name, self.state.epoch, position),
            task_id=task.task_id, family=task.family, messages=messages,
            group_size=self.config.rl.group_size, reward=reward,
            sampling=task.sampling or SamplingParams(), max_turns=s.max_turns or task.max_turns,
            issued_policy_version=policy_version, issued_at=time.time(),
        )

    async def persist(self, count: int) -> None:
        """Record an acknowledged batch of ``count`` groups (position, epoch, issued) atomically."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(state_key(self.config), mapping={
                "epoch": self.state.epoch, "position": self.state.position,
                "seed": self.state.seed, "digest": self.state.digest})
            pipe.incrby(issued_key(self.config), count)
            await pipe.execute()

    async def issued(self) -> int:
        return int(await self.redis.get(issued_key(self.config)) or 0)

    def finished(self, issued: int) -> bool:
        cfg = self.config.sampler
        return bool(cfg.max_groups and issued >= cfg.max_groups) or bool(cfg.epochs and self.state.epoch >= cfg.epochs)

    async def capacity(self, issued: int) -> int:
        """How many groups may be issued now without passing the in-flight cap."""
        in_flight = issued - await groups_resolved(self.redis, self.config.infra)
        self.in_flight.set(in_flight)
        return max_in_flight(self.config) - in_flight

    async def issue(self, producer: EventProducer, stop: asyncio.Event) -> None:
        """The issuing loop: batches up to the free capacity, persisted after each ack."""
        paused = False
        while not stop.is_set():
            issued = await self.issued()
            if self.finished(issued):
                log.info("sampler done: %d groups issued, epoch %d", issued, self.state.epoch)
                return
            free = await self.capacity(issued)
            if free <= 0:
                if not paused:
                    log.info("paused: %d groups in flight >= cap %d (learner behind)", max_in_flight(self.config) - free,
                             max_in_flight(self.config))
                    paused = True
                self.metrics.paused.set(1)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.sampler.poll_s)
                continue
            if paused:
                log.info("resumed: %d groups of capacity free", free)
                paused = False
            self.metrics.paused.set(0)
            count = min(free, len(self.plan) - self.state.position, self.config.sampler.max_batch)
            if self.config.sampler.max_groups:
                count = min(count, self.config.sampler.max_groups - issued)
            version = await learner_version(self.redis, self.config.infra.key_prefix)
            events = [self.event(self.state.position + i, version) for i in range(count)]
            await producer.send_many([("prompts", e) for e in events])
            self.state.position += count
            if self.state.position >= len(self.plan):
                self.state.epoch, self.state.position = self.state.epoch + 1, 0
            await self.persist(count)
            for e in events:
                self.issued_total.labels(e.family).inc()
                if self.config.sampler.adaptive:
                    self.pending[e.group_id] = e.task_id
            while len(self.pending) > PENDING_LIMIT:
                self.pending.popitem(last=False)
            self.position_gauge.set(self.state.position)
            log.debug("issued %s..%s", events[0].group_id, events[-1].group_id)
            if self.state.position == 0:
                await self.start_epoch()

    def observe(self, group: GroupAdvantaged) -> None:
        good = informative(group.stats.reward_std)
        self.adaptive.record(group.task_id, good)
        self.pending.pop(group.group_id, None)
        self.feedback.labels(group.family, str(good).lower()).inc()

    async def check_dropped(self) -> None:
        """Groups the stream dropped (incomplete) never reach ``advantages``: count them as
        uninformative (a filtered group reaches it, flagged, and is observed there)."""
        ids = list(self.pending)[:1000]
        if not ids:
            return
        flags = await self.redis.smismember(key(self.config.infra, "progress:groups_dropped"), ids)
        for gid, dropped in zip(ids, flags):
            if dropped:
                task_id = self.pending.pop(gid)
                self.adaptive.record(task_id, False)
                self.feedback.labels(self.family_of.get(task_id, "?"), "false").inc()

    async def listen(self, producer: EventProducer, stop: asyncio.Event) -> None:
        """Adaptive feedback from ``advantages`` (its own consumer group)."""
        group = f"{self.config.infra.topic_prefix}sampler-{self.config.sampler.run_name}"
        async with EventConsumer(self.config.infra, "advantages", group_id=group, producer=producer,
                                 stage="sampler", metrics=self.metrics) as consumer:
            while not stop.is_set():
                for delivery in await consumer.getmany(max_records=500, timeout_s=1.0):
                    self.observe(delivery.event)
                    consumer.done(delivery)
                await self.check_dropped()
                await consumer.commit()
                for family, score in self.adaptive.family_scores(self.family_of).items():
                    self.family_score.labels(family).set(score)


def intake_tasks(config: Config, tasks: list[TaskSpec], metrics: StageMetrics) -> list[TaskSpec]:
    """The tasks to train on, by the intake report (``rollstream tasks check``) and ``intake.mode``:
    every task that failed a check (or was never checked) is logged with its reasons; under
    ``enforce`` it is quarantined and counted in ``rollstream_sampler_quarantined_tasks{reason}``."""
    mode = config.intake.mode
    if mode == "off":
        return tasks
    path = report_path(config)
    report = load_report(path)
    if report is None:
        log.warning("no intake report at %s: run `rollstream tasks check %s` (intake.mode = %s)", path,
                    " ".join(config.sampler.sources), mode)
    kept, failing = apply_intake(tasks, report, config.intake)
    gauge = metrics.gauge("sampler_quarantined_tasks", "Tasks held back by the intake report (intake.mode = "
                          "enforce), by reason", ("reason",))
    verb = "quarantined" if mode == "enforce" else "trained on anyway (intake.mode = warn)"
    unchecked = [q.task_id for q in failing if q.reasons == ["unchecked"]]
    for q in failing:
        if q.reasons != ["unchecked"]:
            log.warning("task %s fails intake (%s): %s", q.task_id, ", ".join(q.reasons), verb)
    if unchecked:
        log.warning("%d tasks are not in the intake report %s (%s%s): %s", len(unchecked), path,
                    ", ".join(unchecked[:5]), ", ..." if len(unchecked) > 5 else "", verb)
    if mode == "enforce":
        for reason, count in Counter(r for q in failing for r in q.reasons).items():
            gauge.labels(reason).set(count)
        log.info("intake: %d tasks pass, %d quarantined", len(kept), len(failing))
        if not kept:
            raise ConfigError(f"intake.mode = enforce quarantined every task of {config.sampler.sources}: run "
                              "`rollstream tasks check` on them and fix what it reports")
    return kept


async def run(config: Config, *, stop: asyncio.Event | None = None) -> None:
    """Run the sampler until done (max_groups / epochs) or ``stop`` (default: SIGTERM/SIGINT)."""
    if stop is None:
        from rollstream.lifecycle import stop_event

        stop = stop_event(config.infra.stop_grace_s)
    tasks, held_out = split_tasks(load_tasks(config.sampler.sources), config.sampler.holdout_fraction,
                                  config.sampler.holdout_seed, near_threshold=config.intake.near_duplicate_threshold)
    if held_out:
        log.info("%d tasks held out of training (sampler.holdout_fraction %.2f), %d to sample from",
                 len(held_out), config.sampler.holdout_fraction, len(tasks))
    metrics = StageMetrics("sampler")
    tasks = intake_tasks(config, tasks, metrics)
    # advantages: read in a group of its own (the adaptive feedback), not the stage's input
    async with open_stage(config, "sampler", client_id="sampler", metrics=metrics, extra_topics=("advantages",)) as io:
        redis, producer = io.redis, io.producer
        sampler = Sampler(config, redis, tasks, metrics, AdaptiveStats(config.sampler.adaptive_window))
        await sampler.load_state()
        log.info("sampler %s: %d tasks, families %s, cap %d groups in flight", config.sampler.run_name, len(tasks),
                 {f: round(p, 3) for f, p in sampler.probabilities.items()}, max_in_flight(config))
        done = asyncio.Event()  # set when issuing ends, so the feedback loop ends too

        async def issue() -> None:
            try:
                await sampler.issue(producer, stop)
            finally:
                done.set()

        async def stopper() -> None:
            await stop.wait()
            done.set()

        async with asyncio.TaskGroup() as group:
            group.create_task(issue())
            waiter = group.create_task(stopper())
            if config.sampler.adaptive:
                group.create_task(sampler.listen(producer, done))
            await done.wait()
            waiter.cancel()
