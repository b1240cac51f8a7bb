"""The whole pipeline with simulated backends: the async speedup, the overlap and the plumbing.

Each figure comes from real ``rollstream run`` processes (the local broker, Redis, the Faust
stream, every stage as its own process) with the simulated generator, executor and learner
(docs/capacity.md), on the built-in task suite and a tiny model (its tokenizer makes real token
ids; its weights are what the learner publishes):

* ``async_speedup`` = groups/s at ``max_staleness = 4`` / groups/s at ``max_staleness = 0``, where
  one step's generation and its training take the same time (generation: ``a + b * longest``
  seconds per call of one group, log-normal lengths with a long tail; training: a cost per
  token set so that a step's training takes as long as generating its groups). Target >= 1.8.
* ``overlap_efficiency`` = the async run's groups/s / (1 / the larger of the generator's and the
  learner's measured seconds per group). Target >= 0.9.
* ``hops_per_s`` = rollouts/s through all four hops (prompts, actions, rewards, advantages, into
  the learner) with every stage instant. Target >= 2000.

Groups/s are measured between the first and the last learner step of a run (start-up excluded).
Usage: ``python bench/e2e.py --quick --json OUT``; the last line printed holds the figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report
from rollstream.infra import free_port, start_broker, stop_pid

GROUP_SIZE = 8
GROUPS_PER_STEP = 2
MEAN_TOKENS = 64
SIGMA = 0.8  # a long tail: the longest of 8 completions is often 3-4x the median


def write_config(work: Path, name: str, bootstrap: str, model: Path, *, staleness: int, groups_per_step: int,
                 base_s: float, per_token_s: float, learn_per_token_s: float, max_batch: int,
                 archive: bool = False) -> Path:
    path = work / f"{name}.toml"
    path.write_text(f"""
[infra]
kafka_bootstrap = "{bootstrap}"
state_dir = "{work / name}"
partitions = 4

[rl]
group_size = {GROUP_SIZE}
groups_per_step = {groups_per_step}
max_staleness = {staleness}

[sampler]
poll_s = 0.05

[generator]
backend = "sim"
model = "{model}"
max_new_tokens = 512
max_batch_prompts = {max_batch}
batch_wait_ms = 0
weight_wait_s = 0

[generator.sim]
base_s = {base_s}
per_token_s = {per_token_s}
mean_tokens = {MEAN_TOKENS}
sigma = {SIGMA}

[executor]
backend = "sim"
concurrency = 64
pool_size = 64

[stream]
filter_zero_variance = false

[learner]
backend = "sim"
sim_per_token_s = {learn_per_token_s}
model = "{model}"
broadcast_dtype = "float32"

[learner.checkpoint]
every = 0

[archive]
enabled = {"true" if archive else "false"}
""")
    return path


def run(config: Path, steps: int, cwd: Path, skip: int) -> dict[str, Any]:
    """``rollstream run`` to ``steps`` steps; groups/s and the learner's seconds per group, from the
    ``skip``-th step on (before it, the groups issued ahead while the stages started are trained)."""
    result = subprocess.run([sys.executable, "-m", "rollstream.cli", "run", "--config", str(config),
                             "--max-steps", str(steps)], capture_output=True, text=True, cwd=cwd, timeout=900,
                            check=False)
    if result.returncode != 0:
        raise SystemExit(f"rollstream run failed:\n{(result.stdout + result.stderr)[-4000:]}")
    [steps_file] = list(cwd.glob(f"{config.stem}/runs/*/checkpoints/steps.jsonl"))
    records = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    measured = records[skip:]
    first, last = records[skip - 1], records[-1]
    groups = sum(len(r["groups"]) for r in measured)
    rollouts = sum(r["rollouts"] for r in measured)
    seconds = last["time"] - first["time"]
    learn_s_per_group = statistics.mean(r["seconds"] / len(r["groups"]) for r in measured)
    return {"groups_per_s": groups / seconds, "rollouts_per_s": rollouts / seconds, "steps": len(records),
            "learn_s_per_group": learn_s_per_group, "groups": [g for r in measured for g in r["groups"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about three minutes)")
    parser.add_argument("--json", dest="json_out", help="write the headline figures here")
    args = parser.parse_args()
    steps = 16 if args.quick else 40
    work = Path(tempfile.mkdtemp(prefix="rollstream-e2e-bench-"))
    from rollstream.testing import make_tiny_model_dir

    model = make_tiny_model_dir(work / "tiny", max_positions=2048)
    port = free_port()
    broker = start_broker(port, work / "broker.log")
    bootstrap = f"127.0.0.1:{port}"
    try:
        # One group per generate call: a + b * longest with a = 0.1 s, b = 4 ms/token; the expected
        # longest of 8 log-normal lengths (median 64, sigma 0.8) is about 2.6x the median, so one
        # group takes ~0.77 s to generate. Training per token is set so a group trains as long.
        base_s, per_token_s = 0.1, 0.004
        longest = MEAN_TOKENS * 2.6
        gen_s_per_group = base_s + per_token_s * longest
        learn_per_token_s = gen_s_per_group / (GROUP_SIZE * MEAN_TOKENS * 1.38)  # mean of log-normal: e^(s^2/2)
        measured = {}
        for name, staleness in (("sync", 0), ("async", 4)):
            config = write_config(work, name, bootstrap, model, staleness=staleness, groups_per_step=GROUPS_PER_STEP,
                                  base_s=base_s, per_token_s=per_token_s, learn_per_token_s=learn_per_token_s,
                                  max_batch=1, archive=name == "async")
            measured[name] = run(config, steps, work, skip=staleness + 2)
            print(f"{name}: {measured[name]['groups_per_s']:.3f} groups/s, learner "
                  f"{measured[name]['learn_s_per_group']:.3f} s/group", flush=True)
        gen = generator_s_per_group(work / "async", measured["async"]["groups"])
        bound = 1 / max(gen, measured["async"]["learn_s_per_group"])
        config = write_config(work, "instant", bootstrap, model, staleness=4, groups_per_step=32, base_s=0.0,
                              per_token_s=0.0, learn_per_token_s=0.0, max_batch=16)
        instant = run(config, steps, work, skip=5)
        print(f"instant: {instant['rollouts_per_s']:.0f} rollouts/s", flush=True)
        figures = {
            "sync_groups_per_s": round(measured["sync"]["groups_per_s"], 3),
            "async_groups_per_s": round(measured["async"]["groups_per_s"], 3),
            "generator_s_per_group": round(gen, 3),
            "learner_s_per_group": round(measured["async"]["learn_s_per_group"], 3),
            "async_speedup": round(measured["async"]["groups_per_s"] / measured["sync"]["groups_per_s"], 3),
            "overlap_efficiency": round(measured["async"]["groups_per_s"] / bound, 3),
            "hops_per_s": round(instant["rollouts_per_s"], 1),
        }
    finally:
        stop_pid(broker.pid)
        shutil.rmtree(work, ignore_errors=True)
    report(figures, args.json_out)


def generator_s_per_group(state: Path, groups: list[str]) -> float:
    """Mean seconds the generator spent per group of ``groups``: one group per generate call, so a
    group's actions carry its call's duration (``generate_s``), read back from the run's archive."""
    from rollstream.archive import ArchiveStore

    [root] = list(state.glob("runs/*/archive"))
    per_group = {action.rollout.group_id: action.generate_s for _, action in ArchiveStore(str(root)).events("actions")}
    return statistics.mean(per_group[g] for g in groups)


if __name__ == "__main__":
    main()
