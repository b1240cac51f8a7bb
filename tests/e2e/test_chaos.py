"""A shortened chaos round (bench/chaos.py at full length): every stage as its own process with
simulated backends, on the real broker and a Redis of the test's own with append-only persistence;
each stage kind is SIGKILLed once and restarted (the learner with --resume), Redis is killed and
restarted once; after the drain no issued group is lost and the surviving lineage trained none
twice, as the topics tell it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from rollstream.cli.chaos import STAGES, Drill, PrivateRedis, account, drill_config, wait_drained
from rollstream.config_load import load_config
from rollstream.errors import KafkaError
from rollstream.infra import free_port
from rollstream.testing import make_tiny_model_dir
from tests.helpers import wait_until_sync

pytestmark = pytest.mark.e2e


def test_every_stage_killed_once_loses_no_group_and_trains_none_twice(tmp_path: Path, broker: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    redis = PrivateRedis(tmp_path / "redis", free_port())
    redis.start()
    config_path = drill_config(tmp_path, "drill", broker, redis.url, model)
    config = load_config(str(config_path))
    drill = Drill(config_path, tmp_path / "logs")
    rng = random.Random(1)

    def decided(runs: int = 1) -> int:
        """Fates published so far, once ``runs`` learner runs have published some (else 0): the
        pipeline's progress, end to end."""
        drill.check_alive()
        try:
            accounting = asyncio.run(account(config))
        except KafkaError:  # the stages have not created the topics yet
            return 0
        return len(accounting.fates) if accounting.learner_runs >= runs else 0

    try:
        drill.start_all()
        wait_until_sync(decided, "the stages started and the first groups were decided", 180, 1.0)
        for stage in rng.sample(STAGES, len(STAGES)):
            before = decided()
            drill.kill_random(rng, stage)
            if stage == "stream":
                redis.restart()
            # the killed stage is back: groups are decided again after its restart
            wait_until_sync(lambda before=before: decided() > before, f"groups decided after the {stage} kill",
                            180, 1.0)
        # the resumed learner has decided groups (with nothing left to consume it would never speak)
        wait_until_sync(lambda: decided(runs=2), "the resumed learner decided groups", 180, 1.0)
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

    def learner_runs() -> int:
        drill.check_alive()
        try:
            return asyncio.run(account(config)).learner_runs
        except KafkaError:  # the stages have not created the topics yet
            return 0

    try:
        drill.start_all()
        # past the first checkpoint (every 2 steps)
        wait_until_sync(lambda: drill.check_alive() or (steps.exists() and len(steps.read_text().splitlines()) >= 3),
                        "3 learner steps", 240, 0.5)
        killed = drill.kill_rank(rng)
        # groups keep flowing until the restarted learner has decided some
        wait_until_sync(lambda: learner_runs() >= 2, "the restarted learner decided groups", 240, 1.0)
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
