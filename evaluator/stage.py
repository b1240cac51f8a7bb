"""The evaluator: held-out pass@k of the policy versions a run publishes, as they come.

Consumes ``policy`` (``WeightsPublished``) in a consumer group of its own; produces one
``EvalReported`` per version it evaluates or skips on ``evals`` (archived with every topic).

* **Which versions:** every ``eval.every_versions``-th, and the learner's last
  (``EvalConfig.evaluates``). The learner keeps those versions in the weight store past
  ``weights.keep_versions`` (``WeightStore.pin``, at most ``eval.max_pinned`` waiting); the
  evaluator loads exactly that version and unpins it once read. A version it cannot read (it
  expired: the evaluator was down or too far behind) is reported skipped with the reason.
* **What:** the live subset (the first ``eval.live_per_family`` held-out tasks of each family of
  ``sampler.sources``, plus those of ``eval.sources`` when set; ``eval.live_samples`` samples each),
  and at the learner's last version with ``eval.final`` the whole held-out split (and
  ``eval.sources``) at ``eval.samples`` samples. Fixed per-sample seeds (``eval.seed``), played
  by the episode player ``rollstream eval`` uses (``evaluator/play.py``: the executor's rules)
  through a sandbox pool of the evaluator's own: nothing it scores reaches ``actions`` or
  ``rewards``.
* **Keeping up:** versions are evaluated in order; when more than one waits, the older ones are
  reported skipped ("behind") and counted, except the last, which is always evaluated.
* **Crash safety:** a version is reported, then recorded as done in Redis, then its ``policy``
  offset committed; a restarted evaluator skips versions recorded done, so none is reported twice
  (a crash between the report and the record reports it again: at-least-once, the report keyed
  by version).
* **Forgetting:** per family, a bootstrap interval of the live pass@1 over tasks and samples; the
  gauge ``rollstream_evaluator_forgetting{family}`` is 1 while the interval's upper bound lies
  below the family's best earlier live pass@1 (so the noise of a few tasks does not raise it).
* **Domains:** the same per domain (``rollstream.tasks.domain_of``: code, math; ``EvalReported.domains``,
  the gauges ``rollstream_evaluator_domain_heldout_pass1{domain,scope}`` and
  ``rollstream_evaluator_domain_forgetting{domain}``), and a warning naming both when one domain is
  forgetting while another rose above its best (joint training trading one for the other).
* **The split:** with ``eval.heldout_digest`` (``rollstream run`` sets it from ``run.json``), an
  evaluator whose held-out split has another digest refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollstream.config import Config
from rollstream.errors import ConfigError, WeightStoreError
from rollstream.evaluator import report
from rollstream.evaluator.play import Player, SampleResult
from rollstream.metrics import StageMetrics
from rollstream.schemas import DomainEval, EvalReported, FamilyEval

log = logging.getLogger(__name__)
STAGE = "evaluator"


@dataclass
class Plan:
    """What the evaluator evaluates: (task, sample index) pairs, and digests of the task ids."""

    live: list[tuple[Any, int]]
    final: list[tuple[Any, int]]
    heldout_digest: str
    live_digest: str
    final_digest: str


def heldout_split(config: Config) -> tuple[list[Any], list[Any]]:
    """(the run's held-out tasks of ``sampler.sources``, the tasks of ``eval.sources``)."""
    from rollstream.tasks.sources import load_tasks, split_tasks

    _, held_out = split_tasks(load_tasks(config.sampler.sources), config.sampler.holdout_fraction,
                              config.sampler.holdout_seed, near_threshold=config.intake.near_duplicate_threshold)
    extra = load_tasks(config.eval.sources) if config.eval.sources else []
    return held_out, extra


def make_plan(config: Config) -> Plan:
    held_out, extra = heldout_split(config)
    if not held_out and not extra:
        raise ConfigError("the evaluator needs held-out tasks: set sampler.holdout_fraction > 0 (or eval.sources)")
    options = config.eval
    live_tasks, taken = [], defaultdict(int)
    for task in [*held_out, *extra]:
        if taken[task.family] < options.live_per_family:
            taken[task.family] += 1
            live_tasks.append(task)
    final_tasks = [*held_out, *extra]
    return Plan(live=[(t, i) for t in live_tasks for i in range(options.live_samples)],
                final=[(t, i) for t in final_tasks for i in range(options.samples)],
                heldout_digest=report.task_digest(t.task_id for t in held_out),
                live_digest=report.task_digest(t.task_id for t in live_tasks),
                final_digest=report.task_digest(t.task_id for t in final_tasks))


def families_of(results: Sequence[SampleResult], ks: Sequence[int], intervals: dict[str, tuple[float, float]],
                best: dict[str, float]) -> list[FamilyEval]:
    """The report's per-family figures (and ``ALL``)."""
    summary = report.summarize(results, ks)
    flagged = report.forgetting(intervals, best)
    out = []
    for family, row in summary.items():
        low, high = intervals.get(family, (None, None))
        before = best.get(family)
        out.append(FamilyEval(
            family=family, tasks=row["tasks"], samples=row["samples"],
            pass_at={str(k): row[f"pass@{k}"] for k in ks if row.get(f"pass@{k}") is not None},
            mean_reward=row["mean_reward"], with_code=row["with_code"], parses=row["parses"], runs=row["runs"],
            pass1_with_code=row["pass@1|code"], pass1_parsing=row["pass@1|parses"], pass1_running=row["pass@1|runs"],
            ci_low=low, ci_high=high, best_before=before, forgetting=flagged.get(family, False)))
    return out


@dataclass
class Evaluator:
    """One evaluator process: the plan, the policy it loads versions into, and what it has seen."""

    config: Config
    plan: Plan
    store: Any  # the weight store (rollstream.weights.WeightStore)
    backend: Any  # a generation backend holding the policy (load_weights)
    pool: Any  # a sandbox backend of its own
    producer: Any
    redis: Any
    metrics: Any
    best: dict[str, float] = field(default_factory=dict)  # family -> best live pass@1 so far
    best_domains: dict[str, float] = field(default_factory=dict)  # domain -> best live pass@1 so far
    latest: EvalReported | None = None
    references: Any = None  # the tasks' reference checks, made once for every version

    def __post_init__(self) -> None:
        if self.references is None:
            from rollstream.consumers.executor.reference import ReferenceChecks

            self.references = ReferenceChecks(self.pool)

    @property
    def done_key(self) -> str:
        from rollstream.redis import key

        return key(self.config.infra, "evaluator:done")

    async def seen(self, version: int) -> bool:
        return bool(await self.redis.sismember(self.done_key, str(version)))

    async def evaluate(self, version: int, step: int) -> EvalReported:
        """Load ``version`` and evaluate it (the whole split too when it is the learner's last)."""
        started = time.monotonic()
        try:
            loaded, state = await self.store.fetch(version)
        except WeightStoreError as exc:
            return self.skipped(version, step, f"its weights cannot be read (expired before the evaluator got to "
                                               f"it?): {exc}")
        finally:
            with contextlib.suppress(Exception):
                await self.store.unpin(version)
        await self.backend.load_weights(loaded, state)
        del state
        last = version == self.config.learner.max_steps and self.config.eval.final
        samples = self.plan.final if last else self.plan.live
        options = self.config.eval
        player = Player(self.config, self.backend, self.pool, seed=options.seed, turns=options.turns,
                        tests=options.tests, batch=options.batch, references=self.references)
        results = await player.play(samples)
        ks = sorted({k for k in options.ks if k <= (options.samples if last else options.live_samples)} | {1})
        intervals = report.bootstrap_pass1(results, resamples=options.bootstrap_resamples,
                                           level=options.bootstrap_level, seed=options.seed)
        families = families_of(results, ks, intervals, {} if last else self.best)
        domains = report.domains(results, {} if last else self.best_domains, resamples=options.bootstrap_resamples,
                                 level=options.bootstrap_level, seed=options.seed)
        if not last:
            for fam in families:
                if "1" in fam.pass_at:
                    self.best[fam.family] = max(self.best.get(fam.family, 0.0), fam.pass_at["1"])
            self.best_domains = report.best_after(self.best_domains, domains)
        return EvalReported(version=version, step=step, scope="final" if last else "live", families=families,
                            domains=[DomainEval(domain=name, **row) for name, row in domains.items()],
                            samples=len(results), turns=options.turns, seed=options.seed,
                            task_digest=self.plan.final_digest if last else self.plan.live_digest,
                            heldout_digest=self.plan.heldout_digest, duration_s=time.monotonic() - started,
                            reported_at=time.time())

    def skipped(self, version: int, step: int, reason: str) -> EvalReported:
        log.warning("policy version %d: not evaluated: %s", version, reason)
        return EvalReported(version=version, step=step, status="skipped", reason=reason[:4000],
                            heldout_digest=self.plan.heldout_digest, reported_at=time.time())

    async def publish(self, event: EvalReported) -> None:
        """Report, then record the version done (a restart never reports it again); the line
        ``rollstream run`` shows goes to ``evals.jsonl`` beside the learner's ``steps.jsonl``."""
        await self.producer.send("evals", event)
        await self.redis.sadd(self.done_key, str(event.version))
        self.observe(event)
        if self.config.learner.checkpoint.dir:
            import json
            from pathlib import Path

            import msgspec

            path = Path(self.config.learner.checkpoint.dir) / report.EVALS_FILE
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as out:
                out.write(json.dumps(msgspec.to_builtins(event)) + "\n")

    def observe(self, event: EvalReported) -> None:
        self.metrics.versions.labels(event.status, event.scope).inc()
        if event.status != "evaluated":
            return
        self.latest = event
        for fam in event.families:
            labels = (fam.family, event.scope)
            if "1" in fam.pass_at:
                self.metrics.pass1.labels(*labels).set(fam.pass_at["1"])
            if fam.pass1_with_code is not None:
                self.metrics.pass1_code.labels(*labels).set(fam.pass1_with_code)
            if event.scope == "live":
                self.metrics.forgetting.labels(fam.family).set(1.0 if fam.forgetting else 0.0)
        for dom in event.domains:
            if dom.pass1 is not None:
                self.metrics.domain_pass1.labels(dom.domain, event.scope).set(dom.pass1)
            if event.scope == "live":
                self.metrics.domain_forgetting.labels(dom.domain).set(1.0 if dom.forgetting else 0.0)
        self.metrics.version.set(event.version)
        overall = next((f for f in event.families if f.family == report.ALL), None)
        log.info("policy version %d (%s): held-out pass@1 %s over %d samples in %.0f s", event.version, event.scope,
                 f"{overall.pass_at.get('1', 0.0):.3f}" if overall else "-", event.samples, event.duration_s)
        for fam in event.families:
            if fam.forgetting:
                log.warning("family %s is forgetting: pass@1 %.3f (interval up to %.3f) below its best %.3f",
                            fam.family, fam.pass_at.get("1", 0.0), fam.ci_high or 0.0, fam.best_before or 0.0)
        if event.domains:
            log.info("policy version %d (%s): held-out pass@1 per domain: %s", event.version, event.scope,
                     ", ".join(f"{d.domain} {d.pass1 or 0.0:.3f} [{d.ci_low or 0.0:.3f}, {d.ci_high or 0.0:.3f}] over "
                               f"{d.tasks} tasks" for d in event.domains))
        rows = {d.domain: {"forgetting": d.forgetting, "rising": d.rising} for d in event.domains}
        figures = {d.domain: d for d in event.domains}
        for dom in event.domains:
            if dom.forgetting:
                log.warning("domain %s is forgetting: pass@1 %.3f (interval up to %.3f) below its best %.3f",
                            dom.domain, dom.pass1 or 0.0, dom.ci_high or 0.0, dom.best_before or 0.0)
        for down, up in report.trade_offs(rows):
            log.warning("domain %s is forgetting (pass@1 %.3f, best %.3f) while domain %s rose above its best "
                        "(pass@1 %.3f, best %.3f): the mixture trades %s for %s", down, figures[down].pass1 or 0.0,
                        figures[down].best_before or 0.0, up, figures[up].pass1 or 0.0,
                        figures[up].best_before or 0.0, down, up)

    async def handle(self, waiting: list[tuple[int, int]]) -> None:
        """Evaluate the newest waiting version (and the last, whenever it waits); report the others
        skipped as behind. ``waiting``: (version, step) pairs, oldest first."""
        last = self.config.learner.max_steps
        keep = {waiting[-1][0]} | {v for v, _ in waiting if v == last}
        for version, step in waiting:
            if await self.seen(version):
                continue
            if version not in keep:
                newest = waiting[-1][0]
                await self.publish(self.skipped(version, step, f"behind: version {newest} was published before "
                                                               "the evaluator got to this one"))
                with contextlib.suppress(Exception):
                    await self.store.unpin(version)
                continue
            await self.publish(await self.evaluate(version, step))


class EvaluatorMetrics:
    def __init__(self, metrics: StageMetrics) -> None:
        self.versions = metrics.counter("evaluator_versions", "Policy versions the evaluator reported, by status "
                                        "(evaluated, skipped) and scope (live, final)", ("status", "scope"))
        self.pass1 = metrics.gauge("evaluator_heldout_pass1", "Held-out pass@1 of the latest evaluated version, per "
                                   "task family (ALL: every task) and scope", ("family", "scope"))
        self.pass1_code = metrics.gauge("evaluator_heldout_pass1_with_code", "Held-out pass@1 among the samples "
                                        "with a code block (format apart from correctness)", ("family", "scope"))
        self.forgetting = metrics.gauge("evaluator_forgetting", "1 while a family's live pass@1 interval lies below "
                                        "its best earlier pass@1", ("family",))
        self.domain_pass1 = metrics.gauge("evaluator_domain_heldout_pass1", "Held-out pass@1 of the latest evaluated "
                                          "version, per domain (code, math: rollstream.tasks.domain_of) and scope",
                                          ("domain", "scope"))
        self.domain_forgetting = metrics.gauge("evaluator_domain_forgetting", "1 while a domain's live pass@1 "
                                               "interval lies below its best earlier pass@1", ("domain",))
        self.version = metrics.gauge("evaluator_version", "The latest policy version the evaluator evaluated")


async def run(config: Config, *, stop: asyncio.Event | None = None, backend: Any = None, pool: Any = None) -> None:
    """Run the evaluator until ``stop`` is set (default: SIGTERM/SIGINT)."""
    from rollstream.lifecycle import stop_event
    from rollstream.stage_io import open_stage
    from rollstream.weight_files import open_weight_store

    if config.eval.every_versions <= 0:
        raise ConfigError("the evaluator evaluates every eval.every_versions-th version: set it > 0")
    stop = stop or stop_event()
    if config.eval.nice:
        import os

        os.nice(config.eval.nice)  # what the generator and the learner leave
    metrics = StageMetrics(STAGE)
    own = EvaluatorMetrics(metrics)
    plan = make_plan(config)
    if config.eval.heldout_digest and config.eval.heldout_digest != plan.heldout_digest:
        raise ConfigError(f"the held-out split the evaluator would evaluate ({plan.heldout_digest}) is not the one the "
                          f"run trained around ({config.eval.heldout_digest}): the sources or the split settings "
                          "changed; nothing is reported")
    log.info("evaluator: every %d versions; live subset %d tasks x %d samples, final split %d samples; held-out "
             "digest %s", config.eval.every_versions, len(plan.live) // config.eval.live_samples,
             config.eval.live_samples, len(plan.final), plan.heldout_digest)
    async with contextlib.AsyncExitStack() as stack:
        if pool is None:
            from rollstream.consumers.executor.pool import DockerSandboxPool

            pool = await stack.enter_async_context(DockerSandboxPool(config.executor))
        if backend is None:
            backend = await load_backend(config)
        io = await stack.enter_async_context(open_stage(config, STAGE, client_id=STAGE, metrics=metrics,
                                                        max_poll_records=100))
        consumer, redis = io.consumer, io.redis
        assert consumer is not None
        store = open_weight_store(redis, key_prefix=config.infra.key_prefix, settings=config.weights)
        evaluator = Evaluator(config, plan, store, backend, pool, io.producer, redis, own)
        while not stop.is_set():
            deliveries = await consumer.getmany(timeout_s=1.0)
            waiting = [(d.event.version, d.event.step) for d in deliveries
                       if config.eval.evaluates(d.event.version, config.learner.max_steps)]
            if waiting:
                await evaluator.handle(sorted(set(waiting)))
            for delivery in deliveries:
                consumer.done(delivery)
            if deliveries:
                await consumer.commit()


async def load_backend(config: Config) -> Any:
    """The policy's generation backend (transformers, with ``eval.threads`` torch threads)."""
    if config.eval.threads:
        import torch

        torch.set_num_threads(config.eval.threads)
    from rollstream.consumers.generator.backends.hf import TransformersBackend

    return await asyncio.to_thread(TransformersBackend.load, config.eval.model or config.generator.model,
                                   config.generator.device, config.generator.dtype)
