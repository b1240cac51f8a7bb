"""Reward debugging after the broker is gone: a short `rollstream run` on a broker of its own, with
the scripted generator (each task's reference and wrong solutions: a known mix of passes and
failures) and the real Redis, Docker sandboxes and learner, is archived; the broker is stopped
and started again, empty; then `rollstream replay` re-scores every archived action from the
archive (0 changes), a spec override flips exactly the rollouts it should, `rollstream inspect`
shows a group as the archive holds it, and `rollstream runs` lists the run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollstream.archive import ArchiveStore
from rollstream.config import InfraConfig
from rollstream.infra import free_port, start_broker, stop_pid
from rollstream.schemas import RewardScored
from rollstream.testing import make_tiny_model_dir
from tests.helpers import read_events

pytestmark = pytest.mark.e2e
SLOW = "import time\ndef add(a, b):\n    time.sleep(1.0)\n    return a + b\n"
TASKS = [
    {"task_id": f"arch/add-{i}", "family": "arch" if i % 2 else "arch2", "prompt": f"Write add(a, b) ({i}).",
     "reward": {"entry_point": "add", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]},
     "reference_solution": "def add(a, b):\n    return a + b\n"}
    for i in range(4)
]
# Samples 0..3 of every group: the reference (pass), a wrong one (fail), a slow correct one (pass,
# unless the timeout is cut below a second), one that does not compile.
ANSWERS = [{"task_id": t["task_id"], "completion": c} for t in TASKS
           for c in ("def add(a, b):\n    return a - b\n", SLOW, "def add(a, b) return a + b\n")]


def cli(*argv: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollstream.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, check=False)


def test_archived_run_is_replayed_and_inspected_after_the_broker_restarts(tmp_path: Path, redis_url: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny")
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (tmp_path / "answers.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ANSWERS))
    port = free_port()
    broker = start_broker(port, tmp_path / "broker.log")
    config = tmp_path / "rollstream.toml"
    config.write_text(f"""
[infra]
kafka_bootstrap = "127.0.0.1:{port}"
redis_url = "{redis_url}"
topic_prefix = "arch{os.getpid()}."
key_prefix = "arch{os.getpid()}:"
state_dir = "{tmp_path / 'state'}"
partitions = 2

[rl]
group_size = 4
groups_per_step = 2
max_staleness = 1

[sampler]
sources = ["jsonl:{tmp_path / 'tasks.jsonl'}"]

[generator]
backend = {{kind = "scripted", answers = "{tmp_path / 'answers.jsonl'}"}}
model = "{model}"
max_new_tokens = 96

[executor]
concurrency = 2
pool_size = 2

[learner]
model = "{model}"
micro_batch = 4

[learner.checkpoint]
every = 1

[archive]
flush_s = 1.0
""")
    try:
        run = cli("run", "--config", str(config), "--max-steps", "2", cwd=tmp_path, timeout=900)
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-6000:]
        assert "records, complete" in output, output[-3000:]
        [run_dir] = list((tmp_path / "state" / "runs").iterdir())
        store = ArchiveStore(str(run_dir / "archive"))
        assert json.loads((run_dir / "archive" / "_complete.json").read_text())["complete"]
        actions = {r["rollout_id"] for r in store.read("actions", columns=["rollout_id"]).to_pylist()}
        rewards = store.read("rewards", columns=["rollout_id", "verdict"]).to_pylist()
        verdicts = {r["rollout_id"]: r["verdict"] for r in rewards}
        assert actions and set(verdicts) <= actions  # actions in flight at the end have no reward yet
        assert {verdicts[r] for r in verdicts if r.endswith("/0")} == {"pass"}
        assert {verdicts[r] for r in verdicts if r.endswith("/1")} == {"fail"}
        assert {verdicts[r] for r in verdicts if r.endswith("/3")} == {"syntax"}
        # Every group the learner consumed has its fate on record; the trained ones are the steps' groups.
        fates = store.read("fates", columns=["group_id", "verdict"]).to_pylist()
        trained = {f["group_id"] for f in fates if f["verdict"] == "trained"}
        assert len(trained) == 4 and len(fates) == len({f["group_id"] for f in fates})
        assert all(f"{g}/{i}" in verdicts for g in trained for i in range(4))
        # While the broker is up, replay can read the live topics too.
        live = cli("replay", "--config", str(config), "--run", run_dir.name, "--from-broker", "--group", min(trained),
                   "--jsonl", "-", "--json", "live.json", cwd=tmp_path)
        assert live.returncode == 0, (live.stdout + live.stderr)[-3000:]
        summary = json.loads((tmp_path / "live.json").read_text())["all"]
        assert summary["rollouts"] == 4 and summary["changed"] == 0 and summary["not_scored_before"] == 0
    finally:
        stop_pid(broker.pid)
    broker = start_broker(port, tmp_path / "broker2.log")  # the same address, empty: the run's topics are gone
    try:
        replay = cli("replay", "--config", str(config), "--run", run_dir.name, "--jsonl", "same.jsonl",
                     "--json", "same.json", cwd=tmp_path)
        assert replay.returncode == 0, (replay.stdout + replay.stderr)[-4000:]
        same = json.loads((tmp_path / "same.json").read_text())
        assert same["all"]["rollouts"] == len(actions) and same["all"]["changed"] == 0, replay.stdout
        assert same["all"]["not_scored_before"] == len(actions) - len(verdicts) and same["all"]["errors"] == 0
        lines = [json.loads(line) for line in (tmp_path / "same.jsonl").read_text().splitlines()]
        assert {line["rollout_id"] for line in lines} == actions
        assert all(line["before"]["verdict"] == line["after"]["verdict"] for line in lines if line["before"])

        cut = cli("replay", "--config", str(config), "--run", run_dir.name, "--spec", "timeout_s=0.5",
                  "--jsonl", "cut.jsonl", "--json", "cut.json", cwd=tmp_path)
        assert cut.returncode == 0, (cut.stdout + cut.stderr)[-4000:]
        changed = {json.loads(line)["rollout_id"] for line in (tmp_path / "cut.jsonl").read_text().splitlines()
                   if json.loads(line)["changed"]}
        slow = {r for r in verdicts if r.endswith("/2")}
        assert slow and changed == slow
        summary = json.loads((tmp_path / "cut.json").read_text())
        assert summary["all"]["flipped_to_fail"] == len(slow) and summary["all"]["flipped_to_pass"] == 0
        assert "family" in cut.stdout and "arch2" in cut.stdout

        # The tests a task source defines now, matched by task id: one task's tests fixed differently.
        fixed = [dict(t, reward=dict(t["reward"], tests=["assert add(1, 2) == 4"])) if t["task_id"] == "arch/add-1"
                 else t for t in TASKS]
        (tmp_path / "fixed.jsonl").write_text("".join(json.dumps(t) + "\n" for t in fixed))
        retest = cli("replay", "--config", str(config), "--run", run_dir.name, "--tasks",
                     f"jsonl:{tmp_path / 'fixed.jsonl'}", "--jsonl", "fixed-out.jsonl", cwd=tmp_path)
        assert retest.returncode == 0, (retest.stdout + retest.stderr)[-3000:]
        lines = [json.loads(line) for line in (tmp_path / "fixed-out.jsonl").read_text().splitlines()]
        flipped = {line["rollout_id"] for line in lines if line["flipped"]}
        assert flipped == {line["rollout_id"] for line in lines if line["task_id"] == "arch/add-1"
                           and line["before"] and line["before"]["verdict"] == "pass"}
        # The re-scored events onto a new topic of the (new) broker; never the run's live rewards unless --live.
        prefix = json.loads((run_dir / "run.json").read_text())["topic_prefix"]
        refused = cli("replay", "--config", str(config), "--run", run_dir.name, "--to-topic", f"{prefix}rewards",
                      "--jsonl", "-", cwd=tmp_path)
        assert refused.returncode == 2 and "--live" in refused.stderr, refused.stderr[-2000:]
        sent = cli("replay", "--config", str(config), "--run", run_dir.name, "--family", "arch2", "--to-topic",
                   "fixed.rewards", "--jsonl", "-", "--json", "sent.json", cwd=tmp_path)
        assert sent.returncode == 0, (sent.stdout + sent.stderr)[-3000:]
        count = json.loads((tmp_path / "sent.json").read_text())["all"]["rollouts"]
        assert count > 0 and f"wrote {count} RewardScored events to fixed.rewards" in sent.stdout
        on_topic = asyncio.run(read_events(InfraConfig(kafka_bootstrap=f"127.0.0.1:{port}", topic_prefix="fixed."),
                                           "rewards", RewardScored, lambda got: len(got) >= count, timeout_s=20))
        assert len(on_topic) == count and {e.rollout.family for e in on_topic} == {"arch2"}

        group = min(trained)
        shown = cli("inspect", group, "--config", str(config), "--run", run_dir.name, "--json", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr[-3000:]
        found = json.loads(shown.stdout)
        assert found["prompt"][0]["content"].startswith("Write add(a, b)")
        assert [s["sample_index"] for s in found["samples"]] == [0, 1, 2, 3]
        assert [s["execution"]["verdict"] for s in found["samples"]] == ["pass", "fail", "pass", "syntax"]
        assert all(s["advantage"] is not None and s["completion_tokens"] > 0 for s in found["samples"])
        assert [f["fate"] for f in found["fates"]] == ["trained"] and found["fates"][0]["step"] in (1, 2)
        text = cli("inspect", f"{group}/1", "--config", str(config), cwd=tmp_path)
        assert text.returncode == 0 and "fate: trained in learner step" in text.stdout, text.stdout[-2000:]
        assert "return a - b" in text.stdout and "return a + b" not in text.stdout

        runs = cli("runs", "--config", str(config), "--json", cwd=tmp_path)
        [listed] = json.loads(runs.stdout)
        assert listed["run_id"] == run_dir.name and listed["archive"] == "complete" and listed["steps"] == 2
        assert listed["groups"]["trained"] == 4 and listed["infra"] == 0
    finally:
        stop_pid(broker.pid)
