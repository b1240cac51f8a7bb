"""Scaling a consumer group out mid-run, and the bound on a stage's stop, as real processes on the
real broker and Redis:

* a run with one generator and one executor gets a second of each while groups flow: both
  groups rebalance, the newcomers take work, and after the drain no issued group is lost and none
  is trained twice (the topics and fates tell it);
* SIGTERM on a generator busy with a long batch, and on an executor whose sandbox runs a long
  job, ends each within ``infra.stop_grace_s`` (10 s), and the work it abandoned was left
  uncommitted: the next owner does it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import msgspec
import pytest

from rollstream.cli.chaos import Drill, drill_config, wait_drained
from rollstream.config import Config, SimGeneratorConfig
from rollstream.config_load import load_config, to_toml
from rollstream.infra import free_port
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.schemas.events import ActionGenerated, RewardScored, RewardSpec
from rollstream.testing import make_action, make_prompt, make_rollout, make_tiny_model_dir
from tests.helpers import (
    containers_of,
    end,
    read_events,
    scrape_metrics,
    start_worker,
    wait_until_sync,
)

pytestmark = pytest.mark.e2e
BOUND_S = 10.0  # infra.stop_grace_s's default
SLACK_S = 1.5  # the interpreter's own exit


def test_a_second_generator_and_executor_mid_run_take_work_and_lose_nothing(
    tmp_path: Path, broker: str, redis_url: str,
) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    config_path = drill_config(tmp_path, f"scale{time.monotonic_ns() % 10**8}", broker, redis_url, model)
    config = load_config(str(config_path))
    drill = Drill(config_path, tmp_path / "logs",
                  processes={"sampler": 1, "generator": 1, "executor": 1, "stream": 1, "learner": 1})

    def logs() -> dict[str, str]:
        return {p.name: p.read_text(errors="replace")[-1500:] for p in (tmp_path / "logs").glob("*.log")}

    try:
        drill.start_all()
        # one of each, groups flowing: a reward came through
        assert asyncio.run(read_events(config.infra, "rewards", RewardScored, lambda got: len(got) >= 1, 120)), logs()
        for stage in ("generator", "executor"):
            drill.running.append(drill.spawn(stage, 1))
        # the newcomers take work once their groups rebalanced: two generators and two executors speak
        for name, event, author in (("actions", ActionGenerated, "generator_id"),
                                    ("rewards", RewardScored, "executor_id")):
            drill.check_alive()
            asyncio.run(read_events(config.infra, name, event,
                                    lambda got, author=author: len({getattr(e, author) for e in got}) >= 2, 180))
        drill.check_alive()
        drill.stop(("sampler",))
        result = asyncio.run(wait_drained(config, timeout_s=120))
        actions = asyncio.run(read_events(config.infra, "actions", ActionGenerated, timeout_s=5))
        rewards = asyncio.run(read_events(config.infra, "rewards", RewardScored, timeout_s=5))
    finally:
        drill.stop()
        asyncio.run(_clean(config))
    assert result.issued > 0 and result.trained > 0, (result, logs())
    assert result.lost == [] and result.duplicate_trained == [], (result, logs())
    assert len({a.generator_id for a in actions}) == 2, logs()  # the newcomer generated groups
    assert len({r.executor_id for r in rewards}) == 2, logs()  # and executed actions


async def _clean(config: Config) -> None:
    from rollstream.kafka import delete_topics, topic_name
    from rollstream.redis import connect, delete_prefix
    from rollstream.schemas import TOPICS, dlq_spec

    names = [topic_name(config.infra, t) for t in TOPICS] + [topic_name(config.infra, dlq_spec(t).name)
                                                            for t in TOPICS]
    await delete_topics(config.infra, names)
    client = connect(config.infra.redis_url)
    try:
        await delete_prefix(client, config.infra.key_prefix)
    finally:
        await client.aclose()


def _stop_and_time(proc) -> float:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return time.monotonic() - started


def generating(port: int) -> bool:
    try:
        return scrape_metrics(port).get("rollstream_generator_generating", 0.0) == 1.0
    except OSError:  # not serving yet
        return False


SLEEP_SYSCALLS = {"35", "230"}  # nanosleep, clock_nanosleep (x86-64): time.sleep in the completion


def job_running(owner: str) -> bool:
    """A process of one of ``owner``'s sandboxes sleeps in a sleep syscall: the completion's
    ``time.sleep`` runs (the runner itself never sleeps so while a job is in flight)."""
    async def pids() -> list[str]:
        found = []
        for c in await containers_of(owner):
            top = await asyncio.create_subprocess_exec("docker", "top", c["Id"], "-o", "pid",
                                                       stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.DEVNULL)
            out, _ = await top.communicate()
            found += out.split()[1:]
        return [p.decode() for p in found]

    for pid in asyncio.run(pids()):
        try:
            with open(f"/proc/{pid}/syscall") as f:
                if f.read().split(" ", 1)[0] in SLEEP_SYSCALLS:
                    return True
        except OSError:  # ended meanwhile
            continue
    return False


def test_sigterm_ends_a_busy_generator_within_the_bound_and_its_prompt_is_redone(
    config: Config, tmp_path: Path,
) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    port = free_port()
    slow = msgspec.structs.replace(config, generator=msgspec.structs.replace(
        config.generator, backend=SimGeneratorConfig(base_s=120.0), model=str(model), metrics_port=port))
    fast = msgspec.structs.replace(slow, generator=msgspec.structs.replace(slow.generator, backend=SimGeneratorConfig()))
    (tmp_path / "slow.toml").write_text(to_toml(slow))
    (tmp_path / "fast.toml").write_text(to_toml(fast))
    asyncio.run(_produce_prompt(slow))
    log = tmp_path / "generator.log"
    busy = start_worker(tmp_path / "slow.toml", log, "generator")
    try:
        # the prompt is fetched and its batch is generating (for 120 s)
        wait_until_sync(lambda: generating(port) or busy.poll() is not None, "the generator generates", 90)
        assert busy.poll() is None, log.read_text()[-3000:]
        took = _stop_and_time(busy)
        assert took < BOUND_S + SLACK_S, (took, log.read_text()[-3000:])
        assert "abandoning" in log.read_text()
        second = start_worker(tmp_path / "fast.toml", tmp_path / "generator2.log", "generator")
        try:
            actions = asyncio.run(read_events(slow.infra, "actions", ActionGenerated,
                                              lambda got: len(got) >= slow.rl.group_size, 90))
        finally:
            end([second])
    finally:
        end([busy])
    assert sorted(a.rollout.rollout_id for a in actions) == [f"stop-g/{i}" for i in range(slow.rl.group_size)]


async def _produce_prompt(config: Config) -> None:
    await ensure_topics(config.infra, ["prompts", "actions"])
    prompt = msgspec.structs.replace(make_prompt("stop-g"), group_size=config.rl.group_size)
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send("prompts", prompt)


def test_sigterm_ends_an_executor_with_a_long_sandbox_job_within_the_bound_and_the_action_is_redone(
    config: Config, tmp_path: Path, sandbox_image: str, owner: str,
) -> None:
    executor = msgspec.structs.replace(config.executor, image=sandbox_image, owner=owner, pool_size=1,
                                       concurrency=1)
    slow = msgspec.structs.replace(config, executor=executor)
    fast = msgspec.structs.replace(config, executor=msgspec.structs.replace(executor, max_timeout_s=1.0,
                                                                                  default_timeout_s=1.0))
    (tmp_path / "slow.toml").write_text(to_toml(slow))
    (tmp_path / "fast.toml").write_text(to_toml(fast))
    action = msgspec.structs.replace(
        make_action("long", 0), rollout=make_rollout("long", 0),
        completion_text="```python\nimport time\ntime.sleep(50)\ndef add(a, b):\n    return a + b\n```",
        reward=RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3"], timeout_s=55.0))
    asyncio.run(_produce_action(slow, action))
    log = tmp_path / "executor.log"
    busy = start_worker(tmp_path / "slow.toml", log, "executor")
    try:
        # the job is running in its sandbox (for 50 s)
        wait_until_sync(lambda: job_running(owner) or busy.poll() is not None, "the job runs in its sandbox", 90)
        assert busy.poll() is None, log.read_text()[-3000:]
        took = _stop_and_time(busy)
        assert took < BOUND_S + SLACK_S, (took, log.read_text()[-3000:])
        assert "abandoning" in log.read_text()
        second = start_worker(tmp_path / "fast.toml", tmp_path / "executor2.log", "executor")
        try:
            rewards = asyncio.run(read_events(slow.infra, "rewards", RewardScored, lambda got: len(got) >= 1, 90))
        finally:
            end([second])
    finally:
        end([busy])
    assert [r.rollout.rollout_id for r in rewards] == ["long/0"]
    assert rewards[0].execution.error_kind == "timeout"  # redone by the second owner, under its 1 s ceiling


async def _produce_action(config: Config, action: ActionGenerated) -> None:
    await ensure_topics(config.infra, ["actions", "rewards", "audit"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send("actions", action)
