"""The evaluator stage against the real broker, Redis and sandbox, with the scripted backend
answering a planted mix (each task's reference, then its wrong solution): it reports exactly what
the episode player `rollstream eval` uses reports for the same version and seeds (and the mix's
known value), evaluates the final version on the whole split, resumes after a stop without
reporting a version twice, evaluates a version published while it was down, and reports a
version whose weights expired as skipped, with the reason."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
import torch

from rollstream.config import (
    CheckpointConfig,
    Config,
    EvalConfig,
    ExecutorConfig,
    GeneratorConfig,
    LearnerConfig,
    ScriptedConfig,
)
from rollstream.evaluator import stage
from rollstream.evaluator.play import Player
from rollstream.evaluator.report import ALL, summarize
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.redis import connect
from rollstream.schemas import EvalReported
from rollstream.weights import WeightStore
from tests.helpers import read_events

pytestmark = pytest.mark.sandbox


def evaluator_config(config: Config, image: str, owner: str, tmp_path: Path) -> Config:
    return msgspec.structs.replace(
        config,
        sampler=msgspec.structs.replace(config.sampler, sources=["builtin"], holdout_fraction=0.05),
        generator=GeneratorConfig(backend=ScriptedConfig(), model="smollm2", max_new_tokens=400),
        eval=EvalConfig(every_versions=2, live_per_family=1, live_samples=2, samples=1, seed=3, nice=0, batch=32),
        learner=LearnerConfig(max_steps=4, checkpoint=CheckpointConfig(dir=str(tmp_path / "checkpoints"))),
        executor=ExecutorConfig(image=image, owner=owner, pool_size=2, concurrency=4))


async def publish(config: Config, store: WeightStore, versions: list[int], *, pin: bool = True) -> None:
    """Weights of ``versions`` into the store (pinned as the learner pins them), then announced."""
    announced = []
    for version in versions:
        if pin and config.eval.evaluates(version, config.learner.max_steps):
            await store.pin(version)
        announced.append(await store.publish(version, {"w": torch.full((2,), float(version))}, step=version))
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("policy", event) for event in announced])


def known_pass1(config: Config, plan: stage.Plan) -> float:
    """The planted mix's pass@1 over the live subset: sample 0 answers the reference (passes),
    sample 1 the wrong solution where the task has one (fails); a chain ends after its first
    step in one turn (not passed)."""
    from rollstream.consumers.generator.backends.scripted import task_answers

    answers = task_answers(config)
    per_task = {}
    for task, index in plan.live:
        if task.reward.subtasks:
            passed = False
        else:
            passed = (index % len(answers[task.task_id])) == 0
        per_task.setdefault(task.task_id, []).append(passed)
    return sum(sum(v) / len(v) for v in per_task.values()) / len(per_task)


async def test_the_evaluator_reports_what_eval_reports_and_resumes(config, sandbox_image, owner, tmp_path) -> None:
    from rollstream.consumers.executor.pool import DockerSandboxPool
    from rollstream.consumers.generator.backends.scripted import ScriptedBackend

    config = evaluator_config(config, sandbox_image, owner, tmp_path)
    await ensure_topics(config.infra, ["policy", "evals"])
    redis = connect(config.infra.redis_url)
    store = WeightStore(redis, key_prefix=config.infra.key_prefix, keep_versions=1, expire_grace_s=0)
    backend = ScriptedBackend.load(config)
    plan = stage.make_plan(config)
    try:
        async with DockerSandboxPool(config.executor) as pool:
            async def reports_until(count: int) -> list[EvalReported]:
                """The reports so far, by version (the test's topics have several partitions, so a
                read from the start need not keep the order they were written in)."""
                reports = await read_events(config.infra, "evals", EvalReported, lambda got: len(got) >= count,
                                            timeout_s=300)
                return sorted(reports, key=lambda r: r.version)

            async def evaluator_until(count: int, *publishing: list[int]) -> list[EvalReported]:
                """Start the evaluator; publish each batch once the reports before it are in; stop it
                once ``count`` reports are."""
                stop = asyncio.Event()
                running = asyncio.create_task(stage.run(config, stop=stop, backend=backend, pool=pool))
                try:
                    for versions in publishing:
                        await reports_until(count - len(publishing) + publishing.index(versions))
                        await publish(config, store, versions)
                    reports = await reports_until(count)
                    assert not running.done(), running
                finally:
                    stop.set()
                    await asyncio.wait_for(running, 60)
                return reports

            reports = await evaluator_until(2, [1, 2], [3, 4])
            assert [(r.version, r.scope, r.status) for r in reports] == [(2, "live", "evaluated"), (4, "final", "evaluated")]
            live, final = reports
            played = await Player(config, backend, pool, seed=3, turns=1, batch=32).play(plan.live)
            expected = summarize(played, [1, 2])
            overall = {f.family: f for f in live.families}[ALL]
            assert overall.pass_at["1"] == pytest.approx(expected[ALL]["pass@1"])
            assert overall.pass_at["1"] == pytest.approx(known_pass1(config, plan))
            assert live.samples == len(plan.live) and final.samples == len(plan.final)
            assert live.task_digest == plan.live_digest and final.heldout_digest == plan.heldout_digest
            assert overall.with_code == 1.0 and overall.ci_low <= overall.pass_at["1"] <= overall.ci_high

            await publish(config, store, [5, 6, 7])  # while the evaluator is down: evaluated when it is back
            reports = await evaluator_until(3)
            assert [(r.version, r.status) for r in reports] == [(2, "evaluated"), (4, "evaluated"), (6, "evaluated")]
            await publish(config, store, [8], pin=False)  # not kept for it...
            await publish(config, store, [9])  # ... and expired by the next publish (keep_versions 1, no grace)
            reports = await evaluator_until(4)
            assert (reports[3].version, reports[3].status) == (8, "skipped") and "cannot be read" in reports[3].reason
    finally:
        await redis.aclose()
