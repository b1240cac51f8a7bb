"""The executor stage: ``actions`` -> ``rewards`` + ``audit``.

Consumes ``ActionGenerated`` (consumer group ``<topic prefix>executors``). For each, extracts the completion's
code, runs it with its task's tests in a hardened sandbox (consumers/executor/pool.py), scores it
(consumers/executor/rewards.py) and produces one ``RewardScored`` (the action's Rollout carried through
unchanged, the reward, its components and the execution record) to ``rewards`` and one
``SandboxAudit`` per execution to ``audit``.

Guarantees:

* At-least-once: an action's offset is committed only after its reward and audit record were
  acknowledged (acks=all). An executor killed mid-batch re-scores the uncommitted actions after
  a restart (or on another executor of the group); downstream dedupes by ``rollout_id``.
* Hostile code is a reward, never a stalled pipeline: timeouts, crashes, OOM, output floods and
  attacks on the sandbox become verdicts (see docs/executor.md); the pool replaces damaged
  containers in the background.
* Personal data and secrets in what leaves a sandbox (tails, error messages, audit records,
  observations) are replaced by typed placeholders before anything is produced (``intake.scrub``,
  consumers/executor/scrub.py); completions are never rewritten.
* Bad input never stops the stage: undecodable actions are dead-lettered by the consumer; an
  action whose reward spec names an unknown kind or component is dead-lettered here. An action
  the generator could not complete (``error`` set) gets outcome ``infra`` (no reward) and no
  execution, so its group still completes without it.
* Typed outcomes (``RewardScored.outcome``): a job the machinery fails under mid-job (the
  container or the engine lost, the runner dead before its reply, a container unfit) runs again
  on a fresh container, ``executor.infra_attempts`` runs in all; if every run was lost its
  outcome is ``infra``: no reward, and the stream resolves the group without it. Counted by
  cause (``sandbox_lost``) and by outcome (``executor_outcomes``).
* A sandbox backend that cannot start a sandbox at all (Docker down) after bounded retries stops
  the stage without committing what it could not score: nothing is lost, nothing is made up.
* At most ``executor.concurrency`` executions run at once (and at most ``pool_size``: one per
  warm container); at most twice that many actions are fetched ahead.
* Poison records and duplicates (rollstream/guard.py): an action taken ``infra.poison_attempts``
  times without finishing is dead-lettered; an action whose rollout turn was already scored and
  acknowledged is skipped (records with the ``rollstream-replay`` header are always run).
* SIGTERM: stop taking input, finish the executions in flight (actions fetched but not started
  are left uncommitted), send, commit, exit 0; within ``infra.stop_grace_s`` (default 10 s):
  executions still running 3 s before it are abandoned uncommitted (rollstream/lifecycle.py).

Multi-turn episodes (``max_turns > 1``, consumers/executor/episodes.py): a turn that fails and has turns
left is not rewarded; a ``PromptIssued`` continuation for that one sample goes back to ``prompts``
with the transcript and an observation of what went wrong (its offset is done once that is
acknowledged). The last turn's ``RewardScored`` carries the whole trajectory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from redis.exceptions import RedisError

from rollstream.attest import code_digest, load_signer, spec_digest
from rollstream.config import Config
from rollstream.consumers.executor.assets import AssetError
from rollstream.consumers.executor.egress import EgressError
from rollstream.consumers.executor.episodes import after_turn, stale_lag, subtask_turn, turn_code
from rollstream.consumers.executor.jobs import RunResult, SandboxBackend, sandbox_identity
from rollstream.consumers.executor.reference import ReferenceCheck, ReferenceChecks, log_check
from rollstream.consumers.executor.rewards import RewardRegistry, default_registry
from rollstream.consumers.executor.score import SANDBOX_ATTEMPTS, audit_record, evaluate
from rollstream.consumers.executor.scrub import Scrubber
from rollstream.guard import IntakeGuard
from rollstream.kafka import Delivery, EventConsumer, EventProducer
from rollstream.metrics import StageMetrics
from rollstream.schemas.events import ActionGenerated, Event, ExecutionRecord, RewardScored

log = logging.getLogger(__name__)
STAGE = "executor"
COMMIT_EVERY_S = 1.0
PROGRESS_EVERY_S = 30.0


def unit_of(action: ActionGenerated) -> str:
    """What the executor does once per action: one turn of one rollout."""
    return f"{action.rollout.rollout_id}#{action.turn}"


def executor_id() -> str:
    return f"executor-{socket.gethostname()}-{os.getpid()}"


class ExecutorMetrics:
    """The stage's own Prometheus metrics, on the StageMetrics registry."""

    def __init__(self, metrics: StageMetrics) -> None:
        self.executions = metrics.counter("executions", "Sandbox executions by verdict", ("verdict",))
        self.violations = metrics.counter("sandbox_violations", "Violations seen by the sandbox", ("kind",))
        self.recycled = metrics.counter("sandbox_recycled", "Containers retired after an execution")
        self.tamper = metrics.counter(
            "sandbox_tamper", "Executions whose code attacked its verdict, by what it did", ("kind",)
        )
        self.in_process = metrics.counter(
            "sandbox_in_process_verdicts",
            "Verdicts decided in the completion's own process, wholly (trust = in_process) or for some "
            "of the task's tests (mixed: trust = auto on a task whose reference fails under the judge)",
            ("trust",),
        )
        self.lost_guarantees = metrics.counter(
            "sandbox_lost_guarantees", "Executions that ran without one of the judge's guarantees, by guarantee "
            "(ExecutionRecord.lost_guarantees)", ("guarantee",))
        self.seconds = metrics.histogram(
            "execution_seconds", "Wall-clock time of one execution in its sandbox"
        )
        self.outcomes = metrics.counter(
            "executor_outcomes", "Scored turns by typed outcome (RewardScored.outcome; infra: no reward)", ("outcome",))
        self.lost = metrics.counter(
            "sandbox_lost", "Runs the machinery failed under (retried on a fresh container, up to "
            "executor.infra_attempts), by cause", ("cause",))
        self.reward = metrics.histogram(
            "reward", "Rewards given", buckets=(-1, -0.5, -0.2, 0, 0.25, 0.5, 0.75, 1, 2)
        )
        self.continued = metrics.counter("episodes_continued", "Turns that did not end their episode: a "
                                         "continuation was sent back to the generators")
        self.ended_stale = metrics.counter(
            "episodes_ended_stale", "Episodes ended before their turns ran out because the learner would drop "
            "them as stale (their oldest weights more than rl.max_staleness versions behind the learner's)")
        self.reference_checks = metrics.counter(
            "reference_checks", "Tasks whose reference was checked (once per task and executor), by outcome",
            ("outcome",))
        self.egress = metrics.counter(
            "egress_connections", "Connections sandboxes made through the egress proxy, by verdict (allowed, "
            "denied, failed: allowed but unreachable)", ("verdict",))
        self.assets_refused = metrics.counter(
            "assets_refused", "Actions dead-lettered because an asset of their task could not be given to them "
            "(outside executor.asset_sources, unreadable, a wrong digest, over the cache's bound)")
        self.egress_refused = metrics.counter(
            "egress_refused", "Actions dead-lettered because their task asks to reach hosts beyond "
            "executor.egress_allowed")
        self.reference_mismatches = metrics.counter(
            "reference_mismatches", "Tasks whose reference passes in process but fails under the judge")


async def score_action(
    backend: SandboxBackend, registry: RewardRegistry, action: ActionGenerated, executor: str,
    max_timeout_s: float | None = None,
) -> tuple[RewardScored, list[Event]]:
    """The reward of one action and the audit records of what ran for it (see :func:`score_turn`)."""
    reward, audits, _ = await score_turn(backend, registry, action, executor, max_timeout_s)
    return reward, audits


async def score_turn(
    backend: SandboxBackend, registry: RewardRegistry, action: ActionGenerated, executor: str,
    max_timeout_s: float | None = None, references: ReferenceChecks | None = None, attempts: int = SANDBOX_ATTEMPTS,
) -> tuple[RewardScored, list[Event], RunResult | None]:
    """The reward of one action and the audit records of what ran for it (at most ``max_timeout_s``
    of wall-clock time, whatever its spec asks for).

    Raises ValueError for a reward spec the registry rejects, SandboxError when the backend is
    broken (after its retries).
    """
    rollout = action.rollout
    if action.error is not None:
        record = ExecutionRecord(
            sandbox_id="",
            exit_code=None,
            duration_s=0.0,
            error_kind="infra",
            error_message=f"no completion to run: {action.error}"[:4096],
        )
        return RewardScored(
            rollout=rollout,
            reward=0.0,
            components={},
            execution=record,
            executor_id=executor,
            scored_at=time.time(),
        ), [], None
    step = subtask_turn(action)  # a subtask chain: this step's tests, the code carried before this turn's
    spec, completion = step if step is not None else (action.reward, action.completion_text)
    evaluation = await evaluate(backend, registry, spec, completion, rollout.rollout_id, max_timeout_s=max_timeout_s,
                                files=[(f.path, f.data) for f in action.workspace],
                                collect_files=action.turn < action.max_turns,  # an episode's files go on
                                references=references, task_id=rollout.task_id, attempts=attempts)
    scored = evaluation.scored
    reward = RewardScored(
        rollout=rollout,
        reward=scored.reward,
        components=scored.components,
        execution=scored.execution,
        executor_id=executor,
        scored_at=time.time(),
    )
    audit = audit_record(evaluation, backend.limits, rollout.rollout_id, time.time())
    return reward, [audit] if audit is not None else [], evaluation.result


class Executor:
    """The consume -> execute -> produce loop of one executor process."""

    def __init__(
        self,
        config: Config,
        consumer: EventConsumer[ActionGenerated],
        producer: EventProducer,
        backend: SandboxBackend,
        registry: RewardRegistry,
        metrics: StageMetrics,
        guard: IntakeGuard | None = None,
        learner_version: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.config = config
        self.guard = guard
        self.learner_version = learner_version  # None: every episode plays its turns out
        self.stopping = False
        self.consumer = consumer
        self.producer = producer
        self.backend = backend
        self.registry = registry
        self.metrics = metrics
        self.own = ExecutorMetrics(metrics)
        self.executor_id = executor_id()
        self.concurrency = min(config.executor.concurrency, config.executor.pool_size)
        self.references = ReferenceChecks(backend, reported=self.reference_checked)
        self.gate = asyncio.Semaphore(self.concurrency)
        self.verdicts: Tally[str] = Tally()
        self.scrubber = Scrubber(metrics, enabled=config.intake.scrub)  # personal data out of what leaves
        self.signer = load_signer(config.executor.attest)  # None: verdicts unsigned
        if self.signer is not None:
            log.info("signing verdicts with key %s", self.signer.key_id)

    async def run(self, stop: asyncio.Event) -> None:
        in_flight: set[asyncio.Task[None]] = set()
        last_commit = last_progress = time.monotonic()
        async with asyncio.TaskGroup() as tasks:
            while not stop.is_set():
                room = 2 * self.concurrency - len(in_flight)
                if room <= 0:  # enough fetched ahead: wait for one to finish (or for a stop)
                    await asyncio.wait(in_flight, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                else:
                    fetched = await self.consumer.getmany(max_records=room, timeout_s=0.2)
                    for delivery, suspect in await self.admitted(fetched):
                        if suspect:  # it was taken before and never finished: run it alone
                            if in_flight:
                                await asyncio.wait(set(in_flight))
                            await self.guard.start_suspect(delivery)
                            await self.handle(delivery)  # what it raises stops the stage, as before
                            continue
                        task = tasks.create_task(self.handle(delivery))
                        in_flight.add(task)
                        task.add_done_callback(in_flight.discard)
                if self.guard is not None:
                    await self.guard.flush()  # what finished since the last round, in one command
                now = time.monotonic()
                if now - last_commit >= COMMIT_EVERY_S:
                    await self.commit()
                    last_commit = now
                if now - last_progress >= PROGRESS_EVERY_S:
                    log.info(
                        "executor %s: verdicts %s, pending %d",
                        self.executor_id,
                        dict(self.verdicts),
                        self.consumer.pending(),
                    )
                    last_progress = now
            self.stopping = True  # actions still waiting for a sandbox are left uncommitted
            log.info("stopping: finishing the actions in flight (%d fetched)", len(in_flight))
        await self.commit()

    async def admitted(self, deliveries: list[Delivery[ActionGenerated]]
                       ) -> list[tuple[Delivery[ActionGenerated], bool]]:
        """(delivery, suspect) of the deliveries to execute: without rollout turns already scored,
        with poison records dead-lettered (rollstream/guard.py)."""
        if self.guard is None or not deliveries:
            return [(d, False) for d in deliveries]
        units = [unit_of(d.event) for d in deliveries]
        keep = await self.guard.screen(deliveries, units, self.consumer, self.producer)
        return [(deliveries[i], suspect) for i, suspect in keep]

    async def commit(self) -> None:
        if self.guard is not None:
            await self.guard.flush()
        await self.consumer.commit()

    async def handle(self, delivery: Delivery[ActionGenerated]) -> None:
        action = delivery.event
        rollout = action.rollout
        async with self.gate:
            if self.stopping:  # fetched but not started: the next owner runs it
                return
            try:
                reward, audits, result = await score_turn(self.backend, self.registry, action, self.executor_id,
                                                          self.config.executor.max_timeout_s, self.references,
                                                          self.config.executor.infra_attempts)
            except ValueError as exc:  # a reward spec no registered kind accepts, an asset that cannot be had
                if isinstance(exc, (AssetError, EgressError)):
                    (self.own.assets_refused if isinstance(exc, AssetError) else self.own.egress_refused).inc()
                    log.warning("rollout %s: dead-lettered: %s", rollout.rollout_id, exc)
                await self.producer.dead_letter(delivery, f"rejected: {exc}", stage=STAGE)
                if self.guard is not None:
                    self.guard.released(delivery)
                self.consumer.done(delivery)
                return
        reward, audits = await self.scrubber.outgoing(reward, audits, action.reward)
        # the episode's reward for its whole trajectory, or the next turn of this one sample
        outcome: tuple[str, Event] = after_turn(action, reward, result.events if result is not None else [],
                                                workspace=result.files if result is not None else (),
                                                trainable=await self.trainable(action))
        if outcome[0] == "prompts":
            self.own.continued.inc()
            outcome = ("prompts", await self.scrubber.outgoing_prompt(outcome[1], action.reward))
        else:
            reward = outcome[1]
        if self.signer is not None:
            outcome, audits = self.signed(action, outcome, audits)
            if outcome[0] == "rewards":
                reward = outcome[1]
        await self.producer.send_many([outcome] + [("audit", audit) for audit in audits])
        if self.guard is not None:
            self.guard.finished(delivery, unit_of(action))  # written by the run loop, in one round trip
        self.consumer.done(delivery)
        self.observe(reward, audits, final=outcome[0] == "rewards")
        log.debug(
            "scored %s[%d]@%d rollout=%s version=%d reward=%.3f verdict=%s",
            delivery.topic,
            delivery.partition,
            delivery.offset,
            rollout.rollout_id,
            rollout.policy_version_last,
            reward.reward,
            reward.execution.error_kind,
        )

    async def trainable(self, action: ActionGenerated) -> bool:
        """False when the episode would go on but the learner can no longer train it (logged, counted)."""
        if self.learner_version is None or action.turn >= action.max_turns:
            return True
        try:
            learner = await self.learner_version()
        except (OSError, RedisError) as exc:  # unknown: play on (the learner decides)
            log.debug("learner version unavailable: %s", exc)
            return True
        over = stale_lag(action, learner, self.config.rl.max_staleness)
        if over is None:
            return True
        self.own.ended_stale.inc()
        log.info("episode %s ends at turn %d of %d: its oldest weights are %d versions past rl.max_staleness (%d) "
                 "behind the learner's v%d, so the learner would drop it", action.rollout.rollout_id, action.turn,
                 action.max_turns, over, self.config.rl.max_staleness, learner)
        return False

    def signed(self, action: ActionGenerated, outcome: tuple[str, Event], audits: list[Event]
               ) -> tuple[tuple[str, Event], list[Event]]:
        """The verdict (not a continuation) and the audit records, each with its attestation:
        the spec's and the code's digests, the sandbox's image and runtime, signed."""
        assert self.signer is not None
        image, runtime = sandbox_identity(self.backend)
        claims = {"spec_sha256": spec_digest(action.reward), "code_sha256": code_digest(turn_code(action)),
                  "image": image, "runtime": runtime}
        if outcome[0] == "rewards":
            outcome = ("rewards", self.signer.sign_reward(outcome[1], **claims))  # type: ignore[arg-type]
        return outcome, [self.signer.sign_audit(a, **claims) for a in audits]  # type: ignore[arg-type]

    def reference_checked(self, task_id: str, check: ReferenceCheck) -> None:
        """The first time this executor meets a task with a reference: say what it found."""
        outcome = "judged" if check.judged else "in_process_only" if check.in_process else "failing"
        self.own.reference_checks.labels(outcome).inc()
        if check.mismatch:
            self.own.reference_mismatches.inc()
        log_check(task_id, check)

    def observe(self, reward: RewardScored, audits: list, final: bool = True) -> None:
        verdict = reward.execution.error_kind
        self.verdicts[verdict] += 1
        self.own.executions.labels(verdict).inc()
        self.own.outcomes.labels(reward.outcome).inc()
        if reward.outcome == "infra":
            log.warning("rollout %s turn: no reward, the machinery failed under it: %s", reward.rollout.rollout_id,
                        reward.execution.error_message[:300])
        if final and reward.outcome != "infra":  # no reward at all, not a reward of 0
            self.own.reward.observe(reward.reward)
        for kind in filter(None, reward.execution.tamper.split(",")):
            self.own.tamper.labels(kind).inc()
            log.warning("tamper: rollout %s attacked its verdict (%s)", reward.rollout.rollout_id, kind)
        if audits and reward.execution.in_process_tests:
            self.own.in_process.labels(reward.execution.trust).inc()
            for guarantee in reward.execution.lost_guarantees:
                self.own.lost_guarantees.labels(guarantee).inc()
        for audit in audits:
            self.own.seconds.observe(audit.duration_s)
            if audit.recycled:
                self.own.recycled.inc()
            for connection in audit.connections:
                self.own.egress.labels(connection.verdict).inc()
                if connection.verdict != "allowed":
                    log.info("rollout %s: egress %s to %s:%d: %s", audit.rollout_id, connection.verdict,
                             connection.host, connection.port, connection.reason[:200])
            for violation in audit.violations:
                if violation.startswith("lost:"):
                    self.own.lost.labels(violation[5:]).inc()
                elif not violation.startswith("tamper:"):  # counted above, by kind
                    self.own.violations.labels(violation.split(":")[0]).inc()


async def run(
    config: Config,
    *,
    backend: SandboxBackend | None = None,
    registry: RewardRegistry | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run one executor until ``stop`` is set (default: on SIGTERM/SIGINT)."""
    if stop is None:
        from rollstream.lifecycle import stop_event

        stop = stop_event(config.infra.stop_grace_s)
    from rollstream.stage_io import open_stage
    from rollstream.weights import learner_version

    owned = registry is None
    registry = registry or default_registry()
    infra = config.infra
    log.info(
        "executor starting: image=%s pool_size=%d concurrency=%d",
        config.executor.image,
        config.executor.pool_size,
        config.executor.concurrency,
    )
    async with AsyncExitStack() as stack:
        if owned:
            stack.callback(registry.close)  # the answer kinds' worker processes (math_answer)
        if backend is None:
            from rollstream.consumers.executor.backends import open_backend

            backend = await open_backend(config, stack)
        if config.intake.scrub:  # the detectors load in the background (~1.5 s), not on the first hit
            warm = asyncio.get_running_loop().run_in_executor(None, Scrubber.warm)
            stack.callback(warm.cancel)
        io = await stack.enter_async_context(open_stage(config, STAGE, client_id=executor_id(), guard=True,
                                                        max_poll_records=4 * config.executor.concurrency))
        assert io.consumer is not None and io.guard is not None
        await Executor(config, io.consumer, io.producer, backend, registry, io.metrics, io.guard,
                       learner_version=functools.partial(learner_version, io.redis, infra.key_prefix)).run(stop)
    log.info("executor stopped")
