"""Exact resume against the real broker and Redis: the learner dies by SIGKILL at a known point
mid-run (tests/learner/learner_proc.py), resumes from its last checkpoint, and every group is
trained exactly once in the surviving lineage (counted per step from ``steps.jsonl``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from rollstream.config import CheckpointConfig, Config, LearnerConfig, OptimConfig, RLConfig
from rollstream.config_load import to_toml
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.learner.checkpoint import latest_checkpoint, load_state, read_step_log
from rollstream.redis import connect, key
from rollstream.weights import WeightStore, learner_version
from tests.helpers import group

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
GROUPS = 16
PER_STEP = 2
KILLED_AFTER = 5  # the first run dies right after publishing this version (its step)


def write_config(config: Config, path: Path) -> Path:
    path.write_text(to_toml(config))
    return path


def run_learner(config_path: Path, tmp: Path, name: str, *extra: str, expect: int) -> None:
    """The learner in a process of its own (tests/learner/learner_proc.py) until it exits with ``expect``."""
    log = tmp / f"{name}.log"
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "tests.learner.learner_proc", str(config_path), *extra],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert proc.wait(240) == expect, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def test_sigkill_then_resume_trains_every_group_exactly_once(config: Config, learner_model_dir: str,
                                                                   tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    config = msgspec.structs.replace(
        config,
        rl=RLConfig(groups_per_step=PER_STEP, max_staleness=1000, seed=1),
        learner=LearnerConfig(model=learner_model_dir, micro_batch=4, optim=OptimConfig(lr=1e-3),
                              checkpoint=CheckpointConfig(every=2, dir=str(ckpt_dir)), broadcast_every=1,
                              max_steps=GROUPS // PER_STEP),
    )
    groups = [group(f"g{i:02d}", [1.0, -1.0, 0.5, -0.5], seed=i) for i in range(GROUPS)]
    await ensure_topics(config.infra, ["advantages", "policy"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("advantages", g) for g in groups])
        await producer.send("advantages", groups[3])  # an upstream replay: must not be trained twice

    config_path = write_config(config, tmp_path / "learner.toml")
    # The crash lands at a known point: right after step 5's weights were published as version 5,
    # before the next checkpoint (steps 2 and 4 were checkpointed).
    run_learner(config_path, tmp_path, "first", "--kill-after-publishing", str(KILLED_AFTER), expect=-signal.SIGKILL)
    resumed_from = latest_checkpoint(ckpt_dir)
    assert resumed_from is not None
    state = load_state(resumed_from)
    dead_run = read_step_log(ckpt_dir)
    assert state.step == 4 and [r["step"] for r in dead_run] == [1, 2, 3, 4, KILLED_AFTER]

    redis = connect(config.infra.redis_url)
    try:  # broadcast_every=1: the dead run published a version per step it finished
        dead_version = await WeightStore(redis, key_prefix=config.infra.key_prefix).latest_version()
    finally:
        await redis.aclose()
    assert dead_version == KILLED_AFTER and state.policy_version == 4

    run_learner(config_path, tmp_path, "second", "--resume", expect=0)
    log = read_step_log(ckpt_dir)
    first_id = dead_run[0]["run_id"]
    second_id = next(r["run_id"] for r in log if r["run_id"] != first_id)
    before = [r for r in log if r["run_id"] == first_id and r["step"] <= state.step]
    after = [r for r in log if r["run_id"] == second_id]
    lineage = before + after
    assert [r["step"] for r in lineage] == list(range(1, GROUPS // PER_STEP + 1))
    counts = Counter(g for r in lineage for g in r["groups"])
    assert counts == Counter({g.group_id: 1 for g in groups})  # every group exactly once, none twice
    trained_before = {g for r in before for g in r["groups"]}
    assert not trained_before & {g for r in after for g in r["groups"]}
    killed = {g for r in dead_run if r["step"] > state.step for g in r["groups"]}
    assert killed and killed <= {g for r in after for g in r["groups"]}  # the dead steps were redone

    final = load_state(latest_checkpoint(ckpt_dir))
    assert final.step == GROUPS // PER_STEP and final.groups_consumed == GROUPS
    redis = connect(config.infra.redis_url)
    try:
        # Versions are never reused: the resumed lineage continued above the dead run's newest.
        assert await learner_version(redis, config.infra.key_prefix) == dead_version + 1 + GROUPS // PER_STEP - state.step
        assert int(await redis.get(key(config.infra, "progress:groups_consumed"))) == GROUPS
    finally:
        await redis.aclose()


async def test_sigterm_checkpoints_the_current_step_and_exits_cleanly(config: Config, learner_model_dir: str,
                                                                      tmp_path: Path) -> None:
    ckpt_dir = tmp_path / "ckpt"
    config = msgspec.structs.replace(
        config,
        rl=RLConfig(groups_per_step=PER_STEP, max_staleness=1000),
        learner=LearnerConfig(model=learner_model_dir, micro_batch=4, checkpoint=CheckpointConfig(every=100, dir=str(ckpt_dir)),
                              broadcast_every=100, max_steps=4),
    )
    groups = [group(f"h{i}", [1.0, -1.0], seed=i) for i in range(8)]
    await ensure_topics(config.infra, ["advantages", "policy"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("advantages", g) for g in groups])
    config_path = write_config(config, tmp_path / "learner.toml")
    run_learner(config_path, tmp_path, "first", "--term-after-step", "2", expect=0)  # SIGTERM right after step 2
    done = read_step_log(ckpt_dir)
    state = load_state(latest_checkpoint(ckpt_dir))
    assert state.step == done[-1]["step"] == 2  # nothing trained is lost on a graceful stop
    run_learner(config_path, tmp_path, "second", "--resume", expect=0)
    counts = Counter(g for r in read_step_log(ckpt_dir) for g in r["groups"])
    assert counts == Counter({g.group_id: 1 for g in groups})
