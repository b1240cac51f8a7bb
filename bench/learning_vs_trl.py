"""Learning per wall-clock against TRL's GRPOTrainer: held-out pass@1 after the same minutes.

Throughput (``bench/vs_trl.py``) is not the result; held-out accuracy per minute is. Both sides
train SmolLM2-135M-Instruct for the same wall-clock budget B on the same training tasks, with the
same prompts and settings, on the same 2 cores, one after the other (never at once), and save a
checkpoint at the first step end past B/3, 2B/3 and B (time counts from the start of each side's
run: model loading and start-up are part of it). Every checkpoint, and the base model once, is
then evaluated by ``rollstream eval`` on the whole held-out split with the same samples and seeds.

The work, identical on both sides:

* the built-in suite split as ``configs/learning.toml`` splits it (``holdout_fraction`` 0.25,
  ``holdout_seed`` 0, duplicate clusters kept whole), single-turn tasks only (TRL plays no
  multi-turn episode: the subtask chains are left out of both splits, and said so);
* the training tasks in rollstream's sampler order of epoch 0 (seed 0, not adaptive), given to TRL
  as its dataset with its shuffle off; rollstream's sampler reads the same list
  (``intake.mode = "off"``, no split of its own);
* the learning recipe's settings: G = 8, 2 prompts a step, <= 192 new tokens, temperature 1.0,
  lr 5e-6 constant (no warm-up: the two schedulers' warm-ups differ by a step), AdamW, no KL,
  gradient-norm clip 1, clip-higher 0.2/0.28, group-normalised advantages, each completion
  weighing the same in the loss (rollstream ``sequence_mean``, TRL ``loss_type = "grpo"``);
* the same reward code: rollstream's executor rules in its Docker sandboxes (TRL's reward
  function calls a warm sandbox pool, as in ``bench/vs_trl.py``).

rollstream runs as ``rollstream run`` (every stage a process, its default placement), with its own
choices where they are the system's: zero-variance groups skipped (``stream.filter_zero_variance``,
a group with no advantage adds no gradient), one version of staleness, the live evaluator off.

Evaluation (``rollstream eval``): the held-out tasks' held-out tests, ``--samples`` samples a task
(default 2: the 8 of docs/learning.md take 26-35 minutes a checkpoint here, over the 15 allowed),
temperature 1.0, the same seeds for every checkpoint (sample i of task t: ``derive_seed(0, t, i)``).

Figures:

* ``heldout_pass1_trl`` (P) and ``heldout_pass1_rollstream``: mean pass@1 at B over each side's
  runs; ``difference_at_B`` with a bootstrap CI over tasks (each task's pass rate the mean over
  the side's runs);
* ``learning_time_ratio`` = B / the first time rollstream's mean curve (base at 0, then its
  checkpoints, linear between them) reaches P; 0 with ``"not reached"`` if it never does; None
  (undefined) when TRL's gain over the base model at B is not significant (its bootstrap CI over
  tasks includes 0): the headline is then the difference at B;
* ``curves``: every run's (time, pass@1) points and each side's mean curve;
* ``rollstream_seeds``: per seed, pass@1 before (the base) and at B, and the gain over the base
  with a bootstrap CI over tasks and seeds; the format figures (samples with a code block, that
  parse, that run; pass@1 among each) of every evaluation.

Runs interleave (TRL 1, rollstream seed 0, TRL 2, rollstream seed 1, rollstream seed 2) and may
be made at different times: each run's record and each evaluation (report and compressed
completions) is kept under ``--results`` and the bench resumes from them, training only what is
missing (``--max-runs N``: at most N training runs this time). A run cut off before its end is
trained again from its start. Checkpoints live under ``--work`` (outside the repository) and are
deleted once evaluated. Before each training run the machine is checked idle.

    python bench/learning_vs_trl.py --max-runs 2      # the first TRL run and rollstream seed 0, ~75 min
    python bench/learning_vs_trl.py                   # the rest, resuming; prints the figures
    python bench/learning_vs_trl.py --quick --json /tmp/lq.json   # every path, ~15 min (B 3 min, a task a family)

Needs ``trl`` (``pip install '.[bench]'``), Docker with the sandbox image, Redis and the model
wheel. The last line printed is the headline figures; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import vs_trl_probe as probe  # noqa: E402
from bench.common import report  # noqa: E402
from rollstream.infra import free_port  # noqa: E402

RESULTS = REPO / "bench" / "results" / "learning_vs_trl"
WORK = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rollstream" / "bench-learning"
SETTINGS = {"group_size": 8, "groups_per_step": 2, "max_new_tokens": 192, "temperature": 1.0, "top_p": 1.0,
            "top_k": 0, "lr": 5e-6, "kl_beta": 0.0, "clip_low": 0.2, "clip_high": 0.28, "grad_clip": 1.0,
            "loss_type": "grpo", "seed": 0, "holdout_fraction": 0.25, "holdout_seed": 0}
RESAMPLES = 10000


# --- the split ---------------------------------------------------------------------------------

def split_tasks_once() -> tuple[list[Any], list[Any]]:
    """(training tasks, held-out tasks): the single-turn tasks of the built-in suite, split as
    configs/learning.toml splits it."""
    from rollstream.config import IntakeConfig
    from rollstream.tasks.sources import builtin_tasks, split_tasks

    trained, held_out = split_tasks(builtin_tasks(), SETTINGS["holdout_fraction"], SETTINGS["holdout_seed"],
                                    near_threshold=IntakeConfig().near_duplicate_threshold)
    return [t for t in trained if t.max_turns == 1], [t for t in held_out if t.max_turns == 1]


def sampler_order(tasks: list[Any], seed: int) -> list[Any]:
    """``tasks`` in the order rollstream's sampler issues them in epoch 0 with ``rl.seed = seed``
    (not adaptive; a task may come more than once): TRL's dataset for the run of that seed."""
    from rollstream.producers.mixture import epoch_plan, family_probabilities

    families = [t.family for t in tasks]
    probabilities = family_probabilities({f: families.count(f) for f in set(families)}, {}, 0.0)
    return [tasks[i] for i in epoch_plan(families, probabilities, seed=seed, epoch=0)]


def write_tasks(tasks: list[Any], path: Path) -> Path:
    from rollstream.schemas.tasks import encode_task

    path.write_bytes(b"".join(encode_task(t) + b"\n" for t in tasks))
    return path


# --- the sides ---------------------------------------------------------------------------------

def train_trl(name: str, budget_s: float, tasks_file: Path, work: Path, seed: int) -> dict[str, Any]:
    """TRL for ``budget_s`` seconds of its run, checkpoints at B/3, 2B/3, B (bench/vs_trl_trl.py)."""
    out = work / "result.json"
    from rollstream.tasks.sources import jsonl_tasks

    ordered = write_tasks(sampler_order(jsonl_tasks(tasks_file), seed), work / "ordered.jsonl")
    t0 = time.time()
    spec = {"steps": 100000, "gradient_checkpointing": True, "bf16": False, "settings": {**SETTINGS, "seed": seed},
            "tasks_file": str(ordered), "out": str(out), "t0": t0, "checkpoint_dir": str(work),
            "marks_s": [budget_s / 3, 2 * budget_s / 3, budget_s]}
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "vs_trl_trl.py"), json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = proc.communicate(timeout=budget_s + 3600)[0]
    if proc.returncode != 0:
        raise RuntimeError(f"TRL run {name} failed ({proc.returncode}):\n{tail[-4000:]}")
    result = json.loads(out.read_text())
    steps = result["steps"]
    return {"name": name, "side": "trl", "seed": seed, "budget_s": budget_s, "wall_s": round(time.time() - t0, 1),
            "checkpoints": result["checkpoints"], "steps_trained": steps[-1]["step"] if steps else 0,
            "torch_threads": result["torch_threads"], "trl_gradient_checkpointing": True}


def sampling(generator: Any) -> Any:
    """The generator's sampling, the same in training and in evaluation."""
    from msgspec.structs import replace

    return replace(generator, **{k: SETTINGS[k] for k in ("max_new_tokens", "temperature", "top_p", "top_k")})


def rollstream_toml(work: Path, tasks_file: Path, budget_s: float, seed: int) -> Path:
    """The rollstream side's config, written over the profile `rollstream run` applies."""
    from msgspec.structs import replace

    from rollstream.config_load import profiled, to_toml

    s = SETTINGS
    base = profiled()
    learner = base.learner
    config = replace(
        base,
        infra=replace(base.infra, state_dir=str(work / "state"), broker_port=free_port()),
        rl=replace(base.rl, group_size=s["group_size"], groups_per_step=s["groups_per_step"], max_staleness=1,
                   seed=seed),
        sampler=replace(base.sampler, sources=[f"jsonl:{tasks_file}"], adaptive=False),
        intake=replace(base.intake, mode="off"),  # the bench's fixed task list
        stream=replace(base.stream, filter_zero_variance=True),
        generator=sampling(base.generator),
        learner=replace(learner, broadcast_dtype="float32",
                        checkpoint=replace(learner.checkpoint, every=0, every_minutes=budget_s / 3 / 60, keep=10),
                        loss=replace(learner.loss, kl_beta=s["kl_beta"], clip_low=s["clip_low"],
                                     clip_high=s["clip_high"], loss_agg="sequence_mean"),
                        optim=replace(learner.optim, lr=s["lr"], warmup_steps=0, grad_clip=s["grad_clip"])),
        eval=replace(base.eval, every_versions=0),
    )
    path = work / "bench.toml"
    path.write_text(to_toml(config, base))
    return path


def train_rollstream(name: str, budget_s: float, tasks_file: Path, work: Path, seed: int) -> dict[str, Any]:
    """``rollstream run --max-minutes B`` (the learner checkpoints every B/3 of its time and at the
    end); each checkpoint's time is its step's end, from the step log, since the run started."""
    toml = rollstream_toml(work, tasks_file, budget_s, seed)
    argv = [sys.executable, "-m", "rollstream.cli", "run", "--config", str(toml), "--max-steps", "100000",
            "--max-minutes", f"{budget_s / 60:.4f}"]
    t0 = time.time()
    proc = subprocess.run(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=budget_s + 3600, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    runs = sorted((work / "state" / "runs").glob("*/checkpoints"))
    if proc.returncode != 0 or not runs:
        raise RuntimeError(f"rollstream run {name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    root = runs[-1]
    steps = [json.loads(line) for line in (root / "steps.jsonl").read_text().splitlines() if line.strip()]
    step_end = {r["step"]: r["time"] for r in steps if "time" in r}
    checkpoints = []
    for path in sorted(p for p in root.glob("step-*") if p.is_dir()):
        state = json.loads((path / "state.json").read_text())
        ended = step_end.get(state["step"], state["written_at"])
        checkpoints.append({"time_s": round(ended - t0, 2), "step": state["step"], "path": str(path / "model"),
                            "saved_s": round(state["written_at"] - ended, 2)})
    return {"name": name, "side": "rollstream", "seed": seed, "budget_s": budget_s, "wall_s": round(time.time() - t0, 1),
            "checkpoints": checkpoints, "steps_trained": max(step_end, default=0),
            "stale_rollouts": sum(r.get("stale") or 0 for r in steps),
            "filtered_groups": sum(r.get("groups_filtered") or 0 for r in steps),
            "reward_mean_first_last": [steps[0].get("reward_mean"), steps[-1].get("reward_mean")] if steps else None,
            "run_dir": str(root.parent)}


# --- evaluation --------------------------------------------------------------------------------

def evaluate(label: str, model: str, heldout_file: Path, results: Path, samples: int) -> dict[str, Any]:
    """``rollstream eval`` of ``model`` on the held-out tasks' held-out tests; the report, with the
    per-task pass rates, kept as ``evals/LABEL.json`` (completions beside it, gzipped)."""
    from rollstream.cli.evaluate import per_task_pass

    out = results / "evals" / f"{label}.json"
    if out.exists():
        return json.loads(out.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-learning-eval-"))
    toml = work / "eval.toml"
    from msgspec.structs import replace

    from rollstream.config_load import profiled, to_toml

    base = profiled(None)  # `rollstream eval` applies no profile
    config = replace(base, sampler=replace(base.sampler, sources=[f"jsonl:{heldout_file}"]),
                     generator=sampling(base.generator),
                     eval=replace(base.eval, split="all", tests="heldout", samples=samples, ks=[1], batch=16, seed=0))
    toml.write_text(to_toml(config, base))
    completions, report_json = work / "completions.jsonl", work / "report.json"
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "rollstream.cli", "eval", "--config", str(toml), "--model", model,
                           "--json", str(report_json), "--completions", str(completions)], cwd=work,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=7200,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    if proc.returncode != 0:
        raise RuntimeError(f"rollstream eval of {label} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    per_task = per_task_pass(completions)
    evaluation = {"label": label, "model": model, "samples": samples, "eval_wall_s": round(time.time() - started, 1),
                  "pass1": round(statistics.fmean(v for _, v in per_task.values()), 4),
                  "per_task": {t: v for t, (_, v) in sorted(per_task.items())},
                  "family": {t: f for t, (f, _) in sorted(per_task.items())},
                  "report": json.loads(report_json.read_text())}
    gz = out.with_suffix(".completions.jsonl.gz")
    gz.write_bytes(gzip.compress(completions.read_bytes(), mtime=0))
    out.write_text(json.dumps(evaluation, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    print(f"evaluated {label}: pass@1 {evaluation['pass1']} ({len(per_task)} tasks x {samples}, "
          f"{evaluation['eval_wall_s']} s)", flush=True)
    return evaluation


# --- figures -----------------------------------------------------------------------------------

def at_marks(record: dict[str, Any]) -> list[int]:
    """For each mark (B/3, 2B/3, B) the index of the run's checkpoint that stands for it: the first
    saved at a step end past the mark (a step that spanned two marks stands for both), else the
    last (rollstream's learner counts its marks from its own start, a few seconds after the run's;
    its checkpoint at the end is taken at the first step end past B of the run)."""
    budget, times = record["budget_s"], [c["time_s"] for c in record["checkpoints"]]
    if not times:
        raise RuntimeError(f"run {record['name']} saved no checkpoint")
    return [next((i for i, t in enumerate(times) if t >= mark), len(times) - 1)
            for mark in (budget / 3, 2 * budget / 3, budget)]


def mean_tasks(evaluations: list[dict[str, Any]]) -> dict[str, float]:
    """Each task's pass rate, the mean over ``evaluations`` (runs of one side)."""
    tasks = set.intersection(*(set(e["per_task"]) for e in evaluations))
    return {t: statistics.fmean(e["per_task"][t] for e in evaluations) for t in tasks}


def bootstrap(a: list[dict[str, float]], b: list[dict[str, float]], *, seed: int = 0) -> dict[str, Any]:
    """mean(b) - mean(a) over tasks and its 95% bootstrap CI, resampling tasks and, on each side,
    runs (``a``, ``b``: per-task pass rates of each run of that side)."""
    tasks = sorted(set.intersection(*(set(r) for r in a + b)))
    rng = random.Random(seed)

    def side_mean(runs: list[dict[str, float]], chosen: list[str]) -> float:
        picked = rng.choices(runs, k=len(runs))
        return statistics.fmean(statistics.fmean(r[t] for r in picked) for t in chosen)

    point = (statistics.fmean(statistics.fmean(r[t] for r in b) for t in tasks)
             - statistics.fmean(statistics.fmean(r[t] for r in a) for t in tasks))
    diffs = sorted(side_mean(b, chosen) - side_mean(a, chosen)
                   for chosen in (rng.choices(tasks, k=len(tasks)) for _ in range(RESAMPLES)))
    low, high = diffs[int(0.025 * RESAMPLES)], diffs[int(0.975 * RESAMPLES) - 1]
    return {"difference": round(point, 4), "ci95": [round(low, 4), round(high, 4)], "tasks": len(tasks),
            "runs": [len(a), len(b)], "resamples": RESAMPLES, "significant": low > 0 or high < 0}


def mean_curve(runs: list[dict[str, Any]], base: float) -> list[list[float]]:
    """(time s, pass@1) points of a side: base at 0, then the mean over runs of each checkpoint's
    time and pass@1 at each mark (B/3, 2B/3, B)."""
    points = [[0.0, base]]
    for k in range(3):
        points.append([round(statistics.fmean(r["checkpoints"][r["at_marks"][k]]["time_s"] for r in runs), 1),
                       round(statistics.fmean(r["evaluations"][k]["pass1"] for r in runs), 4)])
    return points


def first_reach(curve: list[list[float]], target: float) -> float | None:
    """The first time the piecewise-linear ``curve`` reaches ``target`` (None: never)."""
    for (t0, p0), (t1, p1) in zip(curve, curve[1:]):
        if p0 >= target:
            return t0
        if p1 >= target:
            return t0 + (t1 - t0) * (target - p0) / (p1 - p0)
    return None


def format_figures(evaluation: dict[str, Any]) -> dict[str, Any]:
    row = (evaluation["report"].get("families") or {}).get("ALL") or evaluation["report"].get("all") or {}
    return {k: row.get(k) for k in ("pass@1", "mean_reward", "with_code", "parses", "runs", "pass@1|code",
                                    "pass@1|parses", "pass@1|runs")}


def figures(plan: dict[str, Any], base: dict[str, Any], records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    budget = plan["budget_s"]
    done = {n: r for n, r in records.items() if len(r.get("evaluations", [])) == 3}
    trl = [r for r in done.values() if r["side"] == "trl"]
    ours = [r for r in done.values() if r["side"] == "rollstream"]
    out: dict[str, Any] = {
        "budget_s": budget, "heldout_tasks": len(base["per_task"]), "samples_per_task": base["samples"],
        "heldout_pass1_base": base["pass1"], "runs_done": sorted(done), "runs_planned": plan["order"],
        "curves": {n: [[0.0, base["pass1"]]] + [[r["checkpoints"][i]["time_s"], e["pass1"]] for i, e in
                                                 zip(r["at_marks"], r["evaluations"])] for n, r in done.items()},
        "checkpoint_steps": {n: [r["checkpoints"][i]["step"] for i in r["at_marks"]] for n, r in done.items()},
        "steps_trained": {n: r["steps_trained"] for n, r in done.items()},
        "format": {"base": format_figures(base), **{f"{n}@B": format_figures(r["evaluations"][-1])
                                                     for n, r in done.items()}},
        "eval_wall_s": {"base": base["eval_wall_s"], **{e["label"]: e["eval_wall_s"] for r in done.values()
                                                         for e in r["evaluations"]}}}
    base_tasks = [base["per_task"]]
    if ours:
        out["rollstream_seeds"] = {
            "per_seed": {r["seed"]: {"before": base["pass1"], "at_B": r["evaluations"][-1]["pass1"]} for r in ours},
            "gain_at_B": bootstrap(base_tasks, [r["evaluations"][-1]["per_task"] for r in ours])}
    if not trl or not ours:
        out.update(heldout_pass1_trl=None, heldout_pass1_rollstream=None, learning_time_ratio=None,
                   learning_time_note="incomplete: " + ", ".join(n for n in plan["order"] if n not in done)
                   + " still to train and evaluate")
        return out
    trl_curve, our_curve = mean_curve(trl, base["pass1"]), mean_curve(ours, base["pass1"])
    target = trl_curve[-1][1]
    out.update(curve_trl=trl_curve, curve_rollstream=our_curve, heldout_pass1_trl=target,
               heldout_pass1_rollstream=our_curve[-1][1],
               difference_at_B=bootstrap([r["evaluations"][-1]["per_task"] for r in trl],
                                         [r["evaluations"][-1]["per_task"] for r in ours]),
               trl_gain_at_B=bootstrap(base_tasks, [r["evaluations"][-1]["per_task"] for r in trl]))
    if not out["trl_gain_at_B"]["significant"] or out["trl_gain_at_B"]["difference"] <= 0:
        out.update(learning_time_ratio=None, learning_time_note=(
            "undefined: TRL's gain over the base model at B is not significant (its 95% CI "
            f"{out['trl_gain_at_B']['ci95']} includes 0): the headline is the difference at B"))
        return out
    reached = first_reach(our_curve, target)
    if reached is None:
        out.update(learning_time_ratio=0, learning_time_note="not reached: rollstream's checkpoints never reach P")
    else:
        out.update(learning_time_ratio=round(budget / max(reached, 1e-9), 3), rollstream_time_to_P_s=round(reached, 1),
                   learning_time_note="B / the first time rollstream's mean curve reaches TRL's pass@1 at B")
    return out


def train_and_evaluate(plan: dict[str, Any], results: Path, work_root: Path, tasks_file: Path, heldout_file: Path,
                       max_runs: int | None) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The base model's evaluation, then each run of the plan in order: trained unless its record
    exists (at most ``max_runs`` now), its checkpoints evaluated unless their evaluations exist."""
    budget_s, samples = plan["budget_s"], plan["samples"]
    base = evaluate("base", "smollm2", heldout_file, results, samples)
    records: dict[str, dict[str, Any]] = {}
    trained_now = 0
    for name in plan["order"]:
        record_file = results / "runs" / f"{name}.json"
        if not record_file.exists():
            if max_runs is not None and trained_now >= max_runs:
                continue
            side, seed = ("trl", int(name.split("-")[1]) - 1) if name.startswith("trl") else ("rollstream", int(name[12:]))
            work = work_root / results.name / name
            shutil.rmtree(work, ignore_errors=True)  # a run cut off earlier starts again
            work.mkdir(parents=True)
            check = probe.idle_check()
            print(f"idle check before {name}: {check}", flush=True)
            train = train_trl if side == "trl" else train_rollstream
            record = train(name, budget_s, tasks_file, work, seed)
            record["idle_check"] = check
            record_file.write_text(json.dumps(record, indent=1) + "\n")
            trained_now += 1
            print(f"trained {name}: {record['steps_trained']} steps, checkpoints at "
                  f"{[c['time_s'] for c in record['checkpoints']]} s", flush=True)
        record = json.loads(record_file.read_text())
        record["at_marks"] = at_marks(record)
        record["evaluations"] = []
        for index in record["at_marks"]:
            checkpoint = record["checkpoints"][index]
            label = f"{name}@step{checkpoint['step']}"
            if not (results / "evals" / f"{label}.json").exists() and not Path(checkpoint["path"]).exists():
                sys.exit(f"{label}: its checkpoint {checkpoint['path']} is gone and it was never evaluated: "
                         f"delete {record_file} to train {name} again")
            record["evaluations"].append(evaluate(label, checkpoint["path"], heldout_file, results, samples))
        shutil.rmtree(work_root / results.name / name, ignore_errors=True)
        records[name] = record
    return base, records


# --- the plan ----------------------------------------------------------------------------------

def run_order(trl_runs: int, seeds: list[int]) -> list[str]:
    """TRL 1, rollstream seed a, TRL 2, rollstream seed b, ... then what is left of either side."""
    trl, ours = [f"trl-{i + 1}" for i in range(trl_runs)], [f"rollstream-s{s}" for s in seeds]
    order = []
    for i in range(max(len(trl), len(ours))):
        order += trl[i:i + 1] + ours[i:i + 1]
    return order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="every path, small: B 3 min, 1 TRL run, seed 0, 1 held-out task a family x 1 sample")
    parser.add_argument("--budget-min", type=float, help="the wall-clock budget B of each run (default 20)")
    parser.add_argument("--trl-runs", type=int, help="TRL runs (default 2)")
    parser.add_argument("--seeds", help="rollstream seeds, comma-separated (default 0,1,2)")
    parser.add_argument("--samples", type=int, help="evaluation samples per held-out task (default 2)")
    parser.add_argument("--max-runs", type=int, default=None, help="train at most this many runs now (resume later)")
    parser.add_argument("--results", help=f"where runs and evaluations are kept (default {RESULTS.relative_to(REPO)}; "
                                          "--quick: a temporary directory)")
    parser.add_argument("--work", help=f"checkpoints while they wait for evaluation (default {WORK})")
    parser.add_argument("--json", dest="json_out", help="write every figure here")
    args = parser.parse_args()
    quick = args.quick
    budget_s = 60 * (args.budget_min or (3.0 if quick else 20.0))
    seeds = [int(s) for s in (args.seeds or ("0" if quick else "0,1,2")).split(",")]
    samples = args.samples or (1 if quick else 2)
    results = Path(args.results) if args.results else (Path(tempfile.mkdtemp(prefix="bench-learning-q-"))
                                                      if quick else RESULTS)
    work_root = Path(args.work) if args.work else WORK
    results.mkdir(parents=True, exist_ok=True)
    (results / "runs").mkdir(exist_ok=True)

    from rollstream.evaluator.report import task_digest

    trained, held_out = split_tasks_once()
    if quick:  # a task a family
        held_out = [t for i, t in enumerate(held_out) if t.family not in {u.family for u in held_out[:i]}]
    plan = {"settings": SETTINGS, "budget_s": budget_s, "samples": samples, "quick": quick,
            "order": run_order(args.trl_runs or (1 if quick else 2), seeds),
            "train_digest": task_digest(t.task_id for t in trained), "train_tasks": len(trained),
            "heldout_digest": task_digest(t.task_id for t in held_out), "heldout_tasks": len(held_out)}
    plan_file = results / "plan.json"
    if plan_file.exists():
        kept = json.loads(plan_file.read_text())
        differs = [k for k in ("settings", "budget_s", "samples", "train_digest", "heldout_digest")
                   if kept.get(k) != plan[k]]
        if differs:
            sys.exit(f"{results} holds runs made with other {', '.join(differs)}: resume with the same options, "
                     "or give another --results directory")
        plan["order"] = kept["order"] + [n for n in plan["order"] if n not in kept["order"]]
    plan_file.write_text(json.dumps(plan, indent=1) + "\n")
    data = Path(tempfile.mkdtemp(prefix="bench-learning-tasks-"))
    tasks_file, heldout_file = write_tasks(trained, data / "train.jsonl"), write_tasks(held_out, data / "heldout.jsonl")
    print(f"{len(trained)} training tasks, {len(held_out)} held-out tasks (single-turn), B {budget_s / 60:g} min, "
          f"runs {plan['order']}, results {results}", flush=True)

    try:
        base, records = train_and_evaluate(plan, results, work_root, tasks_file, heldout_file, args.max_runs)
    finally:
        shutil.rmtree(data, ignore_errors=True)
        if quick:  # nothing of a quick run is kept but its results directory
            shutil.rmtree(work_root / results.name, ignore_errors=True)
    out = figures(plan, base, records)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    keys = ("heldout_pass1_trl", "heldout_pass1_rollstream", "learning_time_ratio", "difference_at_B",
            "heldout_pass1_base", "runs_done")
    print(f"curves: {out.get('curve_trl')} (TRL), {out.get('curve_rollstream')} (rollstream); "
          f"{out['learning_time_note']}")
    report({k: out.get(k) for k in keys}, None)


if __name__ == "__main__":
    main()
