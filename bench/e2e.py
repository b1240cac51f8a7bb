"""The whole pipeline with simulated backends: the async speedup, the overlap, the latency and the plumbing.

Each figure comes from real ``rollstream run`` processes (the local broker, Redis, the Faust
stream, every stage as its own process) with the simulated generator, executor and learner
(docs/capacity.md), on the built-in task suite and a tiny model (its tokenizer makes real token
ids; its weights are what the learner publishes):

* ``async_speedup`` = groups/s at ``max_staleness = 4`` / groups/s at ``max_staleness = 0``, where
  one step's generation and its training take the same time (generation: ``a + b * longest``
  seconds per call of one group, log-normal lengths with a long tail; training: a cost per
  token set so that a step's training takes as long as generating its groups). Target >= 1.8.
  Both runs play every task as one turn (``sampler.max_turns = 1``): a subtask chain's later
  turns would add generation the training cost does not match, and the two runs' windows hold
  different mixes of them (``--multi-turn`` keeps the chains, for comparison with earlier JSON).
  Reported only when the synchronous run reaches 90 % of the rate its own stage costs allow
  (``1 / (generator + learner seconds per group)``: at ``max_staleness = 0`` they add up);
  otherwise ``sync_latency_bound`` is true, ``sync_latency_reason`` says by how much, and the
  ratio is left out: it would measure the pipeline's latency, not the overlap.
* ``overlap_efficiency`` = the async run's groups/s / (1 / the larger of the generator's and the
  learner's measured seconds per group). Target >= 0.9.
* ``round_trip_s`` = the median seconds from a group's ``PromptIssued`` to the learner step that
  trains it, with every stage instant and ``max_staleness = 0``, under the shipped defaults of
  every latency setting (fetch waits, linger, poll intervals, batch waits). ``round_trip_hops``
  splits it, each a median over the groups, from the events' own timestamps (read back from
  the run's archive): ``sampler`` (issued -> the generator has it), ``generator`` (-> its last
  action), ``executor`` (-> its last reward), ``stream`` (-> advantaged), ``learner`` (-> the
  step's fate), then the rest of the synchronous cycle: ``weight_publish`` (-> the version is
  published) and ``next_issue`` (-> the next group is issued at that version). Target <= 1 s.
* ``hops_per_s`` = rollouts/s through all four hops (prompts, actions, rewards, advantages, into
  the learner) with every stage instant. Target >= 2000.

Groups/s are measured between the first and the last learner step of a run (start-up excluded).
Usage: ``python bench/e2e.py --quick --json OUT``; the last line printed holds the figures.
``--engine`` measures the generator's engine modes instead (:func:`engine_main`):
``multi_turn_groups_per_s_ratio`` and ``in_flight_gain``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report
from rollstream.config_load import profiled, to_toml
from rollstream.infra import free_port, start_broker, stop_pid

ROOT = Path(__file__).resolve().parents[1]
GROUP_SIZE = 8
GROUPS_PER_STEP = 2
MEAN_TOKENS = 64
SIGMA = 0.8  # a long tail: the longest of 8 completions is often 3-4x the median


def write_config(work: Path, name: str, bootstrap: str, model: Path, *, staleness: int, groups_per_step: int,
                 base_s: float, per_token_s: float, learn_per_token_s: float, max_batch: int,
                 archive: bool = False, max_turns: int | None = None, engine: dict[str, Any] | None = None) -> Path:
    """A run's config. Every latency setting (fetch waits, linger, poll intervals, batch waits,
    weight waits) is left at its shipped default: the figures are those a user gets.
    ``max_turns`` = 1 plays every task as one turn (the suite's subtask chains included)."""
    from msgspec.structs import replace

    from rollstream import config as c

    base = profiled()
    backend = c.SimGeneratorConfig(base_s=base_s, per_token_s=per_token_s, mean_tokens=MEAN_TOKENS,
                                   sigma=engine.get("sigma", SIGMA) if engine else SIGMA,
                                   per_forward_s=engine["per_forward_s"] if engine else 0.0,
                                   per_row_s=engine["per_row_s"] if engine else 0.0)
    generator = replace(base.generator, model=str(model), max_new_tokens=512, max_batch_prompts=max_batch,
                        backend=backend)
    if engine:
        generator = replace(generator, continuous=engine["continuous"], update=engine["update"])
    config = replace(
        base,
        infra=replace(base.infra, kafka_bootstrap=bootstrap, state_dir=str(work / name), partitions=4),
        rl=replace(base.rl, group_size=GROUP_SIZE, groups_per_step=groups_per_step, max_staleness=staleness),
        sampler=replace(base.sampler, max_turns=max_turns) if max_turns else base.sampler,
        generator=generator,
        executor=replace(base.executor, backend=c.SimExecutorConfig(), concurrency=64, pool_size=64),
        stream=replace(base.stream, filter_zero_variance=False),
        learner=replace(base.learner, backend=c.SimLearnerConfig(per_token_s=learn_per_token_s), model=str(model),
                        broadcast_dtype="float32", checkpoint=replace(base.learner.checkpoint, every=0)),
        archive=replace(base.archive, enabled=archive),
    )
    path = work / f"{name}.toml"
    path.write_text(to_toml(config, base))  # over the profile `rollstream run` applies
    return path


def run(config: Path, steps: int, cwd: Path, skip: int) -> dict[str, Any]:
    """``rollstream run`` to ``steps`` steps; groups/s and the learner's seconds per group, from the
    ``skip``-th step on (before it, the groups issued ahead while the stages started are trained)."""
    # The stages import this checkout's code (a worktree), not whichever one is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rollstream.cli", "run", "--config", str(config),
                             "--max-steps", str(steps)], capture_output=True, text=True, cwd=cwd, timeout=900,
                            check=False, env=env)
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
            "learn_s_per_group": learn_s_per_group, "groups": [g for r in measured for g in r["groups"]],
            "window": (first["time"], last["time"]),
            "learner_busy": sum(r.get("seconds", 0.0) for r in measured) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about three minutes)")
    parser.add_argument("--json", dest="json_out", help="write the headline figures here")
    parser.add_argument("--engine", action="store_true",
                        help="only the generator's engine modes (continuous batching, in-flight weight updates) "
                             "against one batch at a time, with a per-forward cost model: "
                             "multi_turn_groups_per_s_ratio and in_flight_gain")
    parser.add_argument("--multi-turn", action="store_true",
                        help="the sync and async runs play the suite's subtask chains as chains (default: every "
                             "task one turn, so a step's generation and training cost the same, as async_speedup "
                             "assumes)")
    args = parser.parse_args()
    if args.engine:
        report(engine_main(args.quick), args.json_out)
        return
    turns = None if args.multi_turn else 1
    steps = 16 if args.quick else 40
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rollstream-e2e-bench-"))
    from rollstream.testing import make_tiny_model_dir

    model = make_tiny_model_dir(work / "tiny", max_positions=2048)
    port = free_port()
    broker = start_broker(port, work / "broker.log")
    bootstrap = f"127.0.0.1:{port}"
    try:
        # One prompt per generate call: a + b * longest with a = 0.1 s, b = 4 ms/token; the expected
        # longest of 8 log-normal lengths (median 64, sigma 0.8) is about 2.6x the median, so a
        # group's first turn takes ~0.77 s to generate (the suite's multi-turn chains add a call per
        # later turn and sample: generator_s_per_group counts them). Training per token is set so a
        # single-turn group trains as long as it generates.
        base_s, per_token_s = 0.1, 0.004
        longest = MEAN_TOKENS * 2.6
        gen_s_per_group = base_s + per_token_s * longest
        learn_per_token_s = gen_s_per_group / (GROUP_SIZE * MEAN_TOKENS * 1.38)  # mean of log-normal: e^(s^2/2)
        measured = {}
        for name, staleness in (("sync", 0), ("async", 4)):
            config = write_config(work, name, bootstrap, model, staleness=staleness, groups_per_step=GROUPS_PER_STEP,
                                  base_s=base_s, per_token_s=per_token_s, learn_per_token_s=learn_per_token_s,
                                  max_batch=1, archive=True, max_turns=turns)
            measured[name] = run(config, steps, work, skip=staleness + 2)
            measured[name]["gen_s_per_group"] = generator_s_per_group(work / name, measured[name]["groups"])
            print(f"{name}: {measured[name]['groups_per_s']:.3f} groups/s, generator "
                  f"{measured[name]['gen_s_per_group']:.3f} s/group, learner "
                  f"{measured[name]['learn_s_per_group']:.3f} s/group", flush=True)
        sync, asynchronous = measured["sync"], measured["async"]
        bound = 1 / max(asynchronous["gen_s_per_group"], asynchronous["learn_s_per_group"])
        gen_busy, gen_gap = generator_busy(work / "async", asynchronous["window"])
        # At max_staleness = 0 a step generates its groups, then trains them: the costs add up.
        sync_bound = 1 / (sync["gen_s_per_group"] + sync["learn_s_per_group"])
        config = write_config(work, "latency", bootstrap, model, staleness=0, groups_per_step=GROUPS_PER_STEP,
                              base_s=0.0, per_token_s=0.0, learn_per_token_s=0.0, max_batch=4, archive=True)
        latency_steps = 12 if args.quick else 30
        run(config, latency_steps, work, skip=2)
        timelines = [t for t in group_timelines(work / "latency") if t["step"] > 2]
        hops = {hop: round(statistics.median(t[hop] for t in timelines), 4) for hop in HOPS}
        print(f"latency: round trip {statistics.median(t['round_trip'] for t in timelines):.3f} s over "
              f"{len(timelines)} groups, hops {hops}", flush=True)
        config = write_config(work, "instant", bootstrap, model, staleness=4, groups_per_step=32, base_s=0.0,
                              per_token_s=0.0, learn_per_token_s=0.0, max_batch=16)
        instant = run(config, steps, work, skip=5)
        print(f"instant: {instant['rollouts_per_s']:.0f} rollouts/s", flush=True)
        figures: dict[str, Any] = {
            "sync_groups_per_s": round(sync["groups_per_s"], 3),
            "sync_bound_groups_per_s": round(sync_bound, 3),
            "sync_generator_s_per_group": round(sync["gen_s_per_group"], 3),
            "sync_learner_s_per_group": round(sync["learn_s_per_group"], 3),
            "async_groups_per_s": round(asynchronous["groups_per_s"], 3),
            "generator_s_per_group": round(asynchronous["gen_s_per_group"], 3),
            "learner_s_per_group": round(asynchronous["learn_s_per_group"], 3),
            "speedup_runs": "multi-turn (the suite's chains)" if args.multi_turn else "single-turn (sampler.max_turns = 1)",
        }
        figures.update(speedup_figures(sync["groups_per_s"], sync_bound, asynchronous["groups_per_s"]))
        figures.update({
            "overlap_efficiency": round(asynchronous["groups_per_s"] / bound, 3),
            "async_generator_busy": round(gen_busy, 3),
            "async_generator_gap_s": round(gen_gap, 4),
            "async_learner_busy": round(asynchronous["learner_busy"], 3),
            "round_trip_s": round(statistics.median(t["round_trip"] for t in timelines), 4),
            "cycle_s": round(statistics.median(t["cycle"] for t in timelines), 4),
            "round_trip_hops": hops,
            "round_trip_groups": len(timelines),
            "hops_per_s": round(instant["rollouts_per_s"], 1),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        })
    finally:
        stop_pid(broker.pid)
        shutil.rmtree(work, ignore_errors=True)
    report(figures, args.json_out)


# The engine comparison's cost model of a GPU decode step: a fixed part per forward (weights read
# once, kernel launches) and a part per row in the batch. A forward of 32 rows costs 3.6x one of 1
# row, so batching well is what makes a token cheap, as it is on real hardware.
PER_FORWARD_S = 0.005
PER_ROW_S = 0.0005
ENGINE_MODES = {  # name: (generator.continuous, generator.update)
    "one_batch_at_a_time": (False, "between_batches"),  # before continuous batching
    "continuous_between_batches": (True, "between_batches"),
    "continuous_in_flight": (True, "in_flight"),
}


def engine_main(quick: bool) -> dict[str, Any]:
    """``multi_turn_groups_per_s_ratio``: groups/s of continuous batching with in-flight updates / one
    batch at a time, with the suite's subtask chains played as chains (their later turns reach the
    generator one sample at a time); ``in_flight_gain``: groups/s with in-flight updates / with
    updates between batches (both continuous), single-turn with a long tail of lengths (sigma 1.2)
    and a fast learner, so a version arrives while long rows are decoding. Each pair alternated
    A B A B in one process (``--quick``: 2 runs a side of 10 steps)."""
    steps, rounds = (10, 2) if quick else (20, 3)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rollstream-engine-bench-"))
    from rollstream.testing import make_tiny_model_dir

    model = make_tiny_model_dir(work / "tiny", max_positions=2048)
    port = free_port()
    broker = start_broker(port, work / "broker.log")
    bootstrap = f"127.0.0.1:{port}"
    runs: dict[str, list[float]] = {}
    try:
        def measure(label: str, mode: str, *, turns: int | None, sigma: float, learn_per_token_s: float,
                    index: int) -> None:
            continuous, update = ENGINE_MODES[mode]
            name = f"{label}-{mode}-{index}"
            config = write_config(work, name, bootstrap, model, staleness=4, groups_per_step=GROUPS_PER_STEP,
                                  base_s=0.0, per_token_s=0.0, learn_per_token_s=learn_per_token_s, max_batch=4,
                                  max_turns=turns, engine={"continuous": continuous, "update": update,
                                                           "sigma": sigma, "per_forward_s": PER_FORWARD_S,
                                                           "per_row_s": PER_ROW_S})
            result = run(config, steps, work, skip=4)
            runs.setdefault(f"{label}:{mode}", []).append(round(result["groups_per_s"], 4))
            print(f"{label} {mode} #{index}: {result['groups_per_s']:.3f} groups/s", flush=True)
            shutil.rmtree(work / name, ignore_errors=True)

        # the learner takes about a quarter of a group's generation: the generator is the bottleneck
        for index in range(rounds):
            for mode in ("one_batch_at_a_time", "continuous_in_flight"):
                measure("multi_turn", mode, turns=None, sigma=SIGMA, learn_per_token_s=2e-5, index=index)
        for index in range(rounds):
            for mode in ("continuous_between_batches", "continuous_in_flight"):
                measure("long_tail", mode, turns=1, sigma=1.2, learn_per_token_s=1e-5, index=index)
    finally:
        stop_pid(broker.pid)
        shutil.rmtree(work, ignore_errors=True)

    def median(key: str) -> float:
        return statistics.median(runs[key])

    return {
        "cost_model": {"per_forward_s": PER_FORWARD_S, "per_row_s": PER_ROW_S, "group_size": GROUP_SIZE,
                       "mean_tokens": MEAN_TOKENS, "max_batch_prompts": 4, "steps": steps},
        "runs_groups_per_s": runs,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "multi_turn_groups_per_s_ratio": round(median("multi_turn:continuous_in_flight")
                                               / median("multi_turn:one_batch_at_a_time"), 3),
        "in_flight_gain": round(median("long_tail:continuous_in_flight")
                                / median("long_tail:continuous_between_batches"), 3),
    }


def speedup_figures(sync_groups_per_s: float, sync_bound: float, async_groups_per_s: float) -> dict[str, Any]:
    """``async_speedup`` when the synchronous run is within 10 % of the rate its stage costs allow;
    otherwise ``sync_latency_bound`` with the reason, and no speedup (it would credit the
    asynchronous run with the synchronous one's waits)."""
    if sync_groups_per_s >= 0.9 * sync_bound:
        return {"sync_latency_bound": False, "async_speedup": round(async_groups_per_s / sync_groups_per_s, 3)}
    lost = 1 / sync_groups_per_s - 1 / sync_bound
    return {"sync_latency_bound": True,
            "sync_latency_reason": (f"the synchronous run made {sync_groups_per_s:.3f} groups/s where its stage costs "
                                    f"allow {sync_bound:.3f}: {lost:.2f} s of every group is pipeline latency, so "
                                    "async_speedup would measure that latency, not the overlap")}


HOPS = ("sampler", "generator", "executor", "stream", "learner", "weight_publish", "next_issue")


def group_timelines(state: Path) -> list[dict[str, float]]:
    """Per trained group of a run (its archive under ``state``): seconds spent in each of ``HOPS``,
    ``round_trip`` (issued -> trained) and ``cycle`` (issued -> the next group issued at the
    version it trained into)."""
    from rollstream.archive import ArchiveStore

    [root] = list(state.glob("runs/*/archive"))
    store = ArchiveStore(str(root))
    return timelines_of(*(list(e for _, e in store.events(name))
                          for name in ("prompts", "actions", "rewards", "advantages", "fates", "policy")))


def timelines_of(prompts: list[Any], actions: list[Any], rewards: list[Any], advantages: list[Any],
                 fates: list[Any], published: list[Any]) -> list[dict[str, float]]:
    """The pure part of :func:`group_timelines`. A group's marks: issued, taken by the generator
    (its first action's ``generated_at - generate_s - queued_s``), last action, last reward,
    advantaged, fate decided, its version published, the first group issued at that version.
    Redelivered copies count once (earliest start, latest end); continuations (later turns) are
    left out: the hops are the first turn's."""
    inf = float("inf")
    issued = {p.group_id: p.issued_at for p in prompts if p.continuation is None}
    first_issue: dict[int, float] = {}
    for p in prompts:
        if p.continuation is None:
            first_issue[p.issued_policy_version] = min(first_issue.get(p.issued_policy_version, inf), p.issued_at)
    taken: dict[str, float] = {}
    generated: dict[str, float] = {}
    for a in actions:
        if a.turn == 1:
            g = a.rollout.group_id
            taken[g] = min(taken.get(g, inf), a.generated_at - a.generate_s - a.queued_s)
            generated[g] = max(generated.get(g, 0.0), a.generated_at)
    scored: dict[str, float] = {}
    for r in rewards:
        scored[r.rollout.group_id] = max(scored.get(r.rollout.group_id, 0.0), r.scored_at)
    emitted = {a.group_id: a.emitted_at for a in advantages}
    published_at = {w.version: w.published_at for w in published}
    out = []
    for fate in sorted((f for f in fates if f.fate == "trained"), key=lambda f: f.decided_at):
        g = fate.group_id
        marks = [issued.get(g), taken.get(g), generated.get(g), scored.get(g), emitted.get(g), fate.decided_at,
                 published_at.get(fate.policy_version), first_issue.get(fate.policy_version)]
        if any(m is None for m in marks):  # e.g. the last step: nothing issued after it
            continue
        issued.pop(g)  # a redelivered fate counts once
        timeline: dict[str, float] = {"step": fate.step}
        timeline.update({hop: end - begin for hop, begin, end in zip(HOPS, marks, marks[1:])})
        timeline["round_trip"] = fate.decided_at - marks[0]
        timeline["cycle"] = marks[-1] - marks[0]
        out.append(timeline)
    return out


def generator_calls(state: Path) -> dict[tuple[str, int, int], tuple[float, float, float]]:
    """The generate calls of a run (its archive under ``state``), one prompt a call
    (``max_batch_prompts = 1``): a group's first turn is one call of its G samples, and each later
    turn of a multi-turn episode (the suite's chain tasks) a call of its own for one sample.
    (group, turn, sample or -1) -> (start, end, seconds)."""
    from rollstream.archive import ArchiveStore

    [root] = list(state.glob("runs/*/archive"))
    calls: dict[tuple[str, int, int], tuple[float, float, float]] = {}
    for _, a in ArchiveStore(str(root)).events("actions"):
        key = (a.rollout.group_id, a.turn, a.rollout.sample_index if a.turn > 1 else -1)
        begin, end, seconds = calls.get(key, (float("inf"), 0.0, 0.0))
        # generate_s: from the call's start to this sample's end (the call's own length: its last sample's)
        calls[key] = (min(begin, a.generated_at - a.generate_s), max(end, a.generated_at), max(seconds, a.generate_s))
    return calls


def generator_s_per_group(state: Path, groups: list[str]) -> float:
    """Mean seconds the generator spent per group of ``groups``: the sum of its calls' durations
    (``generate_s``), its first turn's and every continuation's."""
    per_group: dict[str, float] = {}
    for (group, _, _), (_, _, seconds) in generator_calls(state).items():
        per_group[group] = per_group.get(group, 0.0) + seconds
    return statistics.mean(per_group[g] for g in groups)


def generator_busy(state: Path, window: tuple[float, float]) -> tuple[float, float]:
    """(fraction of ``window`` the generator spent in generate calls, median idle gap between one
    call's end and the next one's start): where the overlap is lost, if it is the generator's."""
    calls: list[tuple[float, float]] = []  # overlapping calls (none, with one generator) merged
    for begin, end in sorted((b, e) for b, e, _ in generator_calls(state).values()):
        if calls and begin <= calls[-1][1]:
            calls[-1] = (calls[-1][0], max(calls[-1][1], end))
        else:
            calls.append((begin, end))
    inside = [(max(b, window[0]), min(e, window[1])) for b, e in calls if e > window[0] and b < window[1]]
    busy = sum(e - b for b, e in inside) / (window[1] - window[0])
    gaps = [nxt[0] - cur[1] for cur, nxt in zip(calls, calls[1:]) if window[0] <= cur[1] <= window[1]]
    return busy, statistics.median(gaps) if gaps else 0.0


if __name__ == "__main__":
    main()
