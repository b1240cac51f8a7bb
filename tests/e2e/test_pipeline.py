"""`rollstream run` end to end: every stage as its own process over the real broker, Redis
and Docker sandboxes, with a tiny random model so it finishes in a few minutes on CPU.

Afterwards the run is checked from what it left on the topics (the test's broker outlives the
run) and in its checkpoint directory: the weights moved, the policy version advanced and was
published, and every group issued is accounted for."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollstream.config import InfraConfig
from rollstream.schemas import GroupAdvantaged, GroupFate, PromptIssued, WeightsPublished
from rollstream.testing import make_tiny_model_dir
from tests.helpers import read_events

pytestmark = pytest.mark.e2e

# Tasks a random model earns different rewards on, so that advantages (and gradients) are not
# all zero: no tests, so a completion that runs cleanly earns 1, one that raises 0, one that does
# not compile -0.5, an empty one -1; with one or two tokens per completion all four happen.
ANYTHING = [
    {"task_id": f"e2e/anything-{i}", "family": "e2e", "prompt": f"Write any Python expression ({i}).",
     "reward": {"tests": []}}
    for i in range(8)
]


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_run_trains_and_checkpoints(tmp_path: Path, broker: str, redis_url: str, max_staleness: int) -> None:
    """Also: a healthy run drops nothing as stale, neither synchronous (max_staleness 0) nor one
    version off-policy (the learner publishes a version before the sampler may issue the groups
    meant for it, and generators catch up with it before sampling them)."""
    model, config = write_config(tmp_path, broker, redis_url, max_staleness)
    result = subprocess.run(
        [sys.executable, "-m", "rollstream.cli", "run", "--config", str(config), "--max-steps", "2"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "learner finished 2 steps" in output, output[-3000:]
    checkpoints = list((tmp_path / "state" / "runs").glob("*/checkpoints"))
    assert checkpoints, output[-3000:]
    assert any(checkpoints[0].rglob("config.json")), list(checkpoints[0].rglob("*"))
    run_id = checkpoints[0].parent.name
    infra = InfraConfig(kafka_bootstrap=broker, topic_prefix=f"e2e{os.getpid()}.{run_id}.")
    assert_weights_moved(model, checkpoints[0])
    steps = assert_groups_accounted_for(infra, checkpoints[0], group_size=4, groups_per_step=2,
                                        max_staleness=max_staleness)
    assert_policy_advanced(infra, steps)
    # staleness as the learner measures it: from policy_version_first, the oldest weights of a rollout
    assert [s["stale"] for s in steps] == [0] * len(steps) and all(s["trained"] for s in steps), steps
    assert_the_run_can_be_watched(checkpoints[0].parent, output, tmp_path)


def test_sigterm_to_the_run_stops_every_stage(tmp_path: Path, broker: str, redis_url: str) -> None:
    """SIGTERM to `rollstream run` (docker stop, systemd, a cancelled job) ends it as Ctrl-C does:
    every stage it started is stopped, by pid, the learner checkpoints, and the run says so. (Its
    children run in sessions of their own, so a run that just died would leave them running.)"""
    _, config = write_config(tmp_path, broker, redis_url, 1)
    log = tmp_path / "run.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rollstream.cli", "run", "--config", str(config),
                                 "--max-steps", "1000"], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "state" / "runs").glob("*/checkpoints/steps.jsonl")):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        pids = [int(pid) for pid in re.findall(r"^started \S+ \(pid (\d+)\)", log.read_text(), re.M)]
        assert len(pids) >= 5, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    for pid in alive:  # the test ends what the run left, then fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, output[-4000:]
    assert code == 130 and "interrupted after" in output, output[-4000:]
    checkpoints = list((tmp_path / "state" / "runs").glob("*/checkpoints/latest"))
    assert checkpoints, output[-3000:]


def write_config(tmp_path: Path, broker: str, redis_url: str, max_staleness: int) -> tuple[Path, Path]:
    """The tiny model and a run config over the test's broker and Redis (the ANYTHING tasks)."""
    model = make_tiny_model_dir(tmp_path / "tiny")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in ANYTHING))
    config = tmp_path / "rollstream.toml"
    config.write_text(f"""
[infra]
kafka_bootstrap = "{broker}"
redis_url = "{redis_url}"
topic_prefix = "e2e{os.getpid()}."
key_prefix = "e2e{os.getpid()}:"
state_dir = "{tmp_path / 'state'}"
partitions = 2

[rl]
group_size = 4
groups_per_step = 2
max_staleness = {max_staleness}

[sampler]
sources = ["jsonl:{tasks}"]

[generator]
model = "{model}"
max_new_tokens = 2
max_batch_prompts = 2
batch_wait_ms = 10

[executor]
concurrency = 2
pool_size = 1

[stream]
filter_zero_variance = false   # a group whose samples happen to agree still counts

[learner]
model = "{model}"
micro_batch = 2

[learner.checkpoint]
every = 1
""")
    return model, config


def assert_the_run_can_be_watched(run_dir: Path, output: str, tmp_path: Path) -> None:
    """A status line per step, a summary, metrics.jsonl and the plot; `rollstream plot` redraws it."""
    assert "step 1/2 v" in output and "step 2/2 v" in output and "steps trained" in output, output[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["completions"] >= 8 and 0 <= r["pass_rate"] <= 1 and r["reward_mean"] is not None for r in records)
    assert all(set(r["waiting"]) == {"prompts", "actions", "rewards", "advantages"} for r in records)
    assert (run_dir / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    redrawn = tmp_path / "again.png"
    result = subprocess.run([sys.executable, "-m", "rollstream.cli", "plot", str(run_dir), str(run_dir), "-o",
                             str(redrawn)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and redrawn.stat().st_size > 10_000, result.stderr[-2000:]


def assert_weights_moved(start: Path, checkpoints: Path) -> None:
    """Training changed the weights (a pipeline that trains on nothing would leave them)."""
    before = load_file(start / "model.safetensors")
    final = sorted(checkpoints.glob("step-*"))[-1]
    after = load_file(final / "model" / "model.safetensors")
    assert before.keys() == after.keys()
    moved = [name for name in before if not torch.equal(before[name], after[name].to(before[name].dtype))]
    assert moved, "no weight changed"


def assert_groups_accounted_for(infra: InfraConfig, checkpoints: Path, *, group_size: int, groups_per_step: int,
                                max_staleness: int) -> list[dict]:
    """Every group the learner consumed was issued and advantaged, none twice; the rest of what
    was issued is no more than the sampler's backpressure lets be in flight."""
    from rollstream.learner.checkpoint import read_step_log

    steps = read_step_log(checkpoints)
    trained = [s for s in steps if s["trained"]]
    assert len(trained) == 2, steps
    consumed = [g for s in steps for g in s["groups"]]
    assert len(consumed) == len(set(consumed)), f"a group was consumed twice: {consumed}"
    assert all(len(s["groups"]) == groups_per_step for s in trained)
    issued = asyncio.run(read_events(infra, "prompts", PromptIssued, timeout_s=5))
    advantaged = asyncio.run(read_events(infra, "advantages", GroupAdvantaged, timeout_s=5))
    issued_ids = [p.group_id for p in issued]
    assert len(issued_ids) == len(set(issued_ids)), "a group was issued twice"
    assert set(consumed) <= {a.group_id for a in advantaged} <= set(issued_ids)
    for group in advantaged:
        assert group.stats.size == group_size and len({r.rollout.rollout_id for r in group.rollouts}) == group_size
    # Each group's fate, as the learner published it: one per group consumed, at the step that trained it.
    fates = asyncio.run(read_events(infra, "fates", GroupFate, lambda got: len(got) >= len(consumed), timeout_s=10))
    assert sorted(f.group_id for f in fates) == sorted(consumed)
    step_of = {g: s["step"] for s in trained for g in s["groups"]}
    assert {f.group_id: f.step for f in fates if f.fate == "trained"} == step_of
    in_flight = set(issued_ids) - set(consumed)
    assert len(in_flight) <= (max_staleness + 1) * groups_per_step, (len(issued_ids), len(consumed))
    return steps


def assert_policy_advanced(infra: InfraConfig, steps: list[dict]) -> None:
    """The learner published a new version per step, each once (what the generators follow)."""
    published = asyncio.run(read_events(infra, "policy", WeightsPublished, timeout_s=5))
    versions = sorted(p.version for p in published)  # the topic's partitions interleave: no global order
    assert len(versions) == len(set(versions)) >= 2, versions
    assert [s["policy_version"] for s in steps if s["trained"]] == versions[-2:]
