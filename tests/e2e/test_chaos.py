"""A shortened chaos round (bench/chaos.py at full length): every stage as its own process with
simulated backends, on the real broker and a Redis of the test's own with append-only persistence;
each stage kind is SIGKILLed once and restarted (the learner with --resume), Redis is killed and
restarted once; after the drain no issued group is lost and the surviving lineage trained none
twice, as the topics tell it."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path

import pytest

from rollstream.chaos import STAGES, Drill, PrivateRedis, account, wait_drained
from rollstream.config import load_config
from rollstream.infra import free_port
from rollstream.testing import make_tiny_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.chaos import drill_config

pytestmark = pytest.mark.e2e


def test_every_stage_killed_once_loses_no_group_and_trains_none_twice(tmp_path: Path, broker: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    redis = PrivateRedis(tmp_path / "redis", free_port())
    redis.start()
    config_path = drill_config(tmp_path, "drill", broker, redis.url, model)
    config = load_config(str(config_path))
    drill = Drill(config_path, tmp_path / "logs")
    rng = random.Random(1)
    try:
        drill.start_all()
        time.sleep(12)  # the stages start and the first groups flow
        for stage in rng.sample(STAGES, len(STAGES)):
            drill.kill_random(rng, stage)
            for _ in range(14):
                time.sleep(0.5)
                drill.check_alive()
            if stage == "stream":
                redis.restart()
        time.sleep(5)
        # groups keep flowing until the resumed learner has decided some (under load it may take a
        # while to start; with nothing left to consume it would never speak)
        deadline = time.monotonic() + 150
        while asyncio.run(account(config)).learner_runs < 2 and time.monotonic() < deadline:
            time.sleep(2)
            drill.check_alive()
        drill.stop(("sampler",))
        result = asyncio.run(wait_drained(config, timeout_s=180, learner_runs=drill.killed["learner"] + 1))
    finally:
        drill.stop()
        redis.kill()
    print(result.figures(), dict(drill.killed))
    logs = {p.name: p.read_text(errors="replace")[-1500:] for p in (tmp_path / "logs").glob("*.log")}
    assert drill.kills == len(STAGES) and set(drill.killed) == set(STAGES)
    assert result.issued > 0 and result.trained > 0, (result, logs)
    assert result.lost == [], (result, logs)
    assert result.duplicate_trained == [], result
    assert result.learner_runs >= 2  # the killed learner resumed as a new run of the same lineage


def test_a_learner_rank_killed_mid_step_loses_no_group_and_trains_none_twice(tmp_path: Path, broker: str) -> None:
    """The learner on 2 ranks (ddp, `rollstream learner --nproc 2` under torchrun); one rank is
    SIGKILLed once the learner has checkpointed and while it trains: torchrun ends the learner and
    starts it again, it resumes from its checkpoint, and the topics show every issued group decided
    once in the surviving lineage (the other stages keep running)."""
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    redis = PrivateRedis(tmp_path / "redis", free_port())
    redis.start()
    config_path = drill_config(tmp_path, "ranks", broker, redis.url, model, learner_ranks=2)
    config = load_config(str(config_path))
    drill = Drill(config_path, tmp_path / "logs")
    rng = random.Random(2)
    steps = Path(config.learner.checkpoint.dir) / "steps.jsonl"
    try:
        drill.start_all()
        deadline = time.monotonic() + 240
        while (not steps.exists() or len(steps.read_text().splitlines()) < 3) and time.monotonic() < deadline:
            time.sleep(0.5)  # past the first checkpoint (every 2 steps)
            drill.check_alive()
        killed = drill.kill_rank(rng)
        deadline = time.monotonic() + 240
        while asyncio.run(account(config)).learner_runs < 2 and time.monotonic() < deadline:
            time.sleep(2)  # groups keep flowing until the restarted learner has decided some
            drill.check_alive()
        drill.stop(("sampler",))
        result = asyncio.run(wait_drained(config, timeout_s=180, learner_runs=drill.learner_runs_expected()))
    finally:
        drill.stop()
        redis.kill()
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in (tmp_path / "logs").glob("*.log")}
    print(result.figures(), f"killed rank {killed}")
    assert drill.killed["learner-rank"] == 1 and drill.restarts == 0  # torchrun restarted it, not the drill
    learner_log = (tmp_path / "logs" / "learner-0.log").read_text(errors="replace")
    runs = [line for line in learner_log.splitlines() if "INFO rollstream.learner.train: learner run" in line
            and ": step " in line]
    assert len(runs) == 2 and "/checkpoints/step-" in runs[1], runs  # the same process, restarted, resumed
    assert result.issued > 0 and result.trained > 0, (result, logs)
    assert result.lost == [], (result, logs)
    assert result.duplicate_trained == [], result
    assert result.learner_runs >= 2
