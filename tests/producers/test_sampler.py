"""The sampler against the real broker and Redis: resume without repeats or gaps, backpressure."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollstream.config import Config, RLConfig, SamplerConfig
from rollstream.kafka import EventConsumer, EventProducer
from rollstream.producers import sampler as sampler_stage
from rollstream.producers.mixture import epoch_plan, family_probabilities
from rollstream.producers.sampler import max_in_flight, run
from rollstream.redis import connect, set_groups_consumed
from rollstream.schemas.events import PromptIssued, RewardSpec
from rollstream.schemas.tasks import TaskSpec, encode_task
from rollstream.tasks.sources import load_tasks
from tests.helpers import wait_until


def write_tasks(path: Path, n_a: int = 4, n_b: int = 3) -> Path:
    tasks = [TaskSpec(task_id=f"{fam}/t{i}", family=fam, prompt=f"task {fam} {i}",
                      reward=RewardSpec(entry_point="f", tests=["assert f() == 1"]))
             for fam, n in (("a", n_a), ("b", n_b)) for i in range(n)]
    path.write_bytes(b"".join(encode_task(t) + b"\n" for t in tasks))
    return path


def make_config(config: Config, tasks: Path, **sampler: object) -> Config:
    return msgspec.structs.replace(
        config,
        rl=RLConfig(group_size=2, groups_per_step=2, max_staleness=1, seed=7),
        sampler=SamplerConfig(sources=[f"jsonl:{tasks}"], family_temperature=1.0, adaptive=False,
                              poll_s=0.05, max_batch=3, **sampler),
    )


async def read_prompts(config: Config, expected: int, timeout_s: float = 30.0) -> list[PromptIssued]:
    """Everything on `prompts` (waits until `expected` records arrived, then 1 s more for extras)."""
    out: list[PromptIssued] = []
    async with EventProducer(config.infra, client_id="reader") as producer:
        async with EventConsumer(config.infra, "prompts", group_id=f"reader-{uuid.uuid4().hex[:6]}",
                                 producer=producer, stage="test") as consumer:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            extra_until = None
            while loop.time() < deadline and (extra_until is None or loop.time() < extra_until):
                out += [d.event for d in await consumer.getmany(timeout_s=0.5)]
                if len(out) >= expected and extra_until is None:
                    extra_until = loop.time() + 1.0
    return out


async def no_backpressure(config: Config) -> None:
    redis = connect(config.infra.redis_url)
    await set_groups_consumed(redis, config.infra, 10**9)
    await redis.aclose()


@pytest.mark.integration
async def test_resume_issues_every_position_once(config: Config, tmp_path: Path) -> None:
    tasks_file = write_tasks(tmp_path / "tasks.jsonl")
    await no_backpressure(config)
    # first run stops after 10 groups (one full epoch of 7 and 3 positions of the next) ...
    await asyncio.wait_for(run(make_config(config, tasks_file, max_groups=10), stop=asyncio.Event()), 60)
    # ... a restart (a fresh process would do the same: all state is in Redis) continues to 17
    await asyncio.wait_for(run(make_config(config, tasks_file, max_groups=17), stop=asyncio.Event()), 60)
    prompts = await read_prompts(config, 17)
    ids = [p.group_id for p in prompts]
    assert len(ids) == len(set(ids)) == 17, Counter(ids).most_common(3)
    # exactly the uninterrupted plan, position by position
    tasks = load_tasks([f"jsonl:{tasks_file}"])
    families = [t.family for t in tasks]
    probs = family_probabilities(Counter(families), {}, 1.0)
    expected = {}
    for epoch in range(3):
        for position, index in enumerate(epoch_plan(families, probs, seed=7, epoch=epoch)):
            expected[f"run-{epoch}-{position}"] = tasks[index].task_id
    issued = {p.group_id: p.task_id for p in prompts}
    assert set(issued) == {f"run-0-{i}" for i in range(7)} | {f"run-1-{i}" for i in range(7)} | {f"run-2-{i}" for i in range(3)}
    assert all(issued[g] == expected[g] for g in issued)
    # with temperature 1 and no feedback, an epoch issues every task exactly once
    for epoch in (0, 1):
        assert sorted(issued[f"run-{epoch}-{i}"] for i in range(7)) == sorted(t.task_id for t in tasks)


@pytest.mark.integration
async def test_restart_after_stop_mid_run(config: Config, tmp_path: Path, monkeypatch) -> None:
    """A sampler stopped mid-run (the SIGTERM path: its stop event is set between two batches)
    resumes where it was."""
    tasks_file = write_tasks(tmp_path / "tasks.jsonl")
    await no_backpressure(config)
    stop = asyncio.Event()
    persist = sampler_stage.Sampler.persist

    async def persist_then_stop(self: sampler_stage.Sampler, count: int) -> None:
        await persist(self, count)
        if await self.issued() >= 4:  # the first few batches are out (mid-epoch: 7 tasks, batches of 3)
            stop.set()

    monkeypatch.setattr(sampler_stage.Sampler, "persist", persist_then_stop)
    first = asyncio.create_task(run(make_config(config, tasks_file, max_groups=400), stop=stop))
    redis = connect(config.infra.redis_url)
    try:
        await asyncio.wait_for(first, 30)
        monkeypatch.setattr(sampler_stage.Sampler, "persist", persist)
        persisted = int(await redis.get(f"{config.infra.key_prefix}sampler:issued"))
        assert 0 < persisted < 400
        await asyncio.wait_for(run(make_config(config, tasks_file, max_groups=persisted + 9), stop=asyncio.Event()), 60)
    finally:
        await redis.aclose()
    prompts = await read_prompts(config, persisted + 9)
    ids = [p.group_id for p in prompts]
    assert len(ids) == len(set(ids)) == persisted + 9
    positions = sorted((int(g.split("-")[1]), int(g.split("-")[2])) for g in ids)
    assert positions == [(i // 7, i % 7) for i in range(persisted + 9)]  # no gap, no repeat


@pytest.mark.integration
async def test_backpressure_cap_holds_while_learner_is_slow(config: Config, tmp_path: Path, monkeypatch) -> None:
    tasks_file = write_tasks(tmp_path / "tasks.jsonl")
    cfg = make_config(config, tasks_file, max_groups=12)
    cfg = msgspec.structs.replace(cfg, sampler=msgspec.structs.replace(cfg.sampler, adaptive=True))
    cap = max_in_flight(cfg)
    assert cap == 4
    redis = connect(cfg.infra.redis_url)
    issued_key = f"{cfg.infra.key_prefix}sampler:issued"

    async def issued() -> int:
        return int(await redis.get(issued_key) or 0)

    looked: list[int] = []  # the in-flight count the sampler computed, each time it looked
    resolved = sampler_stage.groups_resolved

    async def counted(*args: Any) -> int:
        looked.append(await resolved(*args))
        return looked[-1]

    monkeypatch.setattr(sampler_stage, "groups_resolved", counted)

    async def settle(expect: int) -> None:
        await wait_until(lambda: at_least(issued, expect), f"{expect} groups issued")
        seen = len(looked)
        # two more looks at the learner's progress: a whole turn of its loop saw this state, so
        # had there been room it would have issued (and persisted) more by now
        await wait_until(lambda: len(looked) >= seen + 2, "the sampler looked at the learner's progress again")

    task = asyncio.create_task(run(cfg, stop=asyncio.Event()))
    try:
        await settle(cap)
        assert await issued() == cap  # learner has consumed nothing: exactly the cap is in flight
        await set_groups_consumed(redis, cfg.infra, 1)  # the slow learner takes one group
        await settle(cap + 1)
        assert await issued() == cap + 1
        await redis.sadd(f"{cfg.infra.key_prefix}progress:groups_dropped", "x-1", "x-2")  # the stream drops two
        await settle(cap + 3)
        assert await issued() == cap + 3
        await set_groups_consumed(redis, cfg.infra, 100)  # learner catches up: runs to max_groups
        await asyncio.wait_for(task, 30)
        assert await issued() == 12
    finally:
        task.cancel()
        await redis.aclose()
    prompts = await read_prompts(cfg, 12)
    assert sorted(p.group_id for p in prompts) == sorted({p.group_id for p in prompts}) and len(prompts) == 12


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["nope", "jsonl:/does/not/exist"])
async def test_bad_source_is_a_config_error(bad: str) -> None:
    from rollstream.errors import ConfigError

    with pytest.raises(ConfigError):
        load_tasks([bad])


async def at_least(count: Any, expect: int) -> bool:
    return await count() >= expect
