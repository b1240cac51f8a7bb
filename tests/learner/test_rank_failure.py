"""A learner rank SIGKILLed mid-run (issue 26): the whole learner ends, torchrun starts every rank
again (``--max-restarts``, what ``rollstream learner --nproc N`` runs), the restarted learner
resumes from the last sharded checkpoint, and the surviving lineage trains every group exactly
once, against the real broker and Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from rollstream.cli.chaos import rank_pids
from rollstream.config import CheckpointConfig, Config, LearnerConfig, OptimConfig, RLConfig
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.learner import sharded_checkpoint as sharded_ckpt
from rollstream.learner.checkpoint import read_step_log
from tests.helpers import REPO, group, write_config

pytestmark = pytest.mark.integration
GROUPS, PER_STEP = 16, 2


async def wait_for(predicate, timeout_s: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the launcher exited with {proc.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("victim", [1, 0])  # a rank that trains its share; the rank that runs the stage
async def test_killed_rank_restarts_the_learner_and_trains_every_group_once(
        config: Config, learner_model_dir: str, tmp_path: Path, victim: int) -> None:
    ckpt_dir = tmp_path / "ckpt"
    config = msgspec.structs.replace(
        config,
        rl=RLConfig(groups_per_step=PER_STEP, max_staleness=1000, seed=1),
        learner=LearnerConfig(model=learner_model_dir, micro_batch=2, optim=OptimConfig(lr=1e-3), parallel="fsdp",
                              ranks=2, checkpoint=CheckpointConfig(every=2, dir=str(ckpt_dir)),
                              max_steps=GROUPS // PER_STEP))
    groups = [group(f"g{i:02d}", [1.0, -1.0, 0.5, -0.5], seed=i) for i in range(GROUPS)]
    await ensure_topics(config.infra, ["advantages", "policy", "fates"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("advantages", g) for g in groups])
    config_path = write_config(config, tmp_path / "learner.toml")
    log = open(tmp_path / "launcher.log", "wb")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=2",
         "-m", "tests.learner.learner_proc", str(config_path), "--step-sleep", "0.4"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
    try:
        await wait_for(lambda: len(read_step_log(ckpt_dir)) >= 5, 300, launcher, "5 steps")
        dead_run = read_step_log(ckpt_dir)
        os.kill(rank_pids(launcher.pid)[victim], signal.SIGKILL)
        code = await asyncio.to_thread(launcher.wait, 300)
        assert code == 0, (tmp_path / "launcher.log").read_text()[-5000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)
        log.close()
    text = (tmp_path / "launcher.log").read_text(errors="replace")
    assert "restarted by the launcher" in text  # torchrun restarted the ranks, which resumed
    records = read_step_log(ckpt_dir)
    first_id = dead_run[0]["run_id"]
    runs = list(dict.fromkeys(r["run_id"] for r in records))
    assert len(runs) == 2 and runs[0] == first_id, runs
    after = [r for r in records if r["run_id"] == runs[1]]
    resumed_at = after[0]["step"] - 1  # the checkpoint the restart resumed from
    assert resumed_at in (2, 4, 6) and resumed_at < max(r["step"] for r in dead_run)
    lineage = [r for r in records if r["run_id"] == first_id and r["step"] <= resumed_at] + after
    assert [r["step"] for r in lineage] == list(range(1, GROUPS // PER_STEP + 1))
    assert Counter(g for r in lineage for g in r["groups"]) == Counter({g.group_id: 1 for g in groups})
    final = sharded_ckpt.latest_checkpoint(ckpt_dir)
    assert sharded_ckpt.is_sharded(final)
    state = sharded_ckpt.load_state(final)
    assert state.step == GROUPS // PER_STEP and state.groups_consumed == GROUPS
    assert not rank_pids(launcher.pid)  # no rank outlived its launcher
