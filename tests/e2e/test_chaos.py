"""A shortened chaos round (bench/chaos.py at full length): every stage as its own process with
simulated backends, on the real broker and a Redis of the test's own with append-only persistence;
each stage kind is SIGKILLed once and restarted (the learner with --resume), Redis is killed and
restarted once; after the drain no issued group is lost and the surviving lineage trained none
twice, as the topics tell it."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from rollstream.cli.chaos import STAGES, Drill, PrivateRedis, account, drill_config, wait_drained
from rollstream.config_load import load_config
from rollstream.infra import free_port
from rollstream.testing import make_tiny_model_dir

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
