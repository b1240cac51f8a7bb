"""`rollstream eval`: pass@1 / pass@k per task family at a fixed policy, without Kafka.

Runs a prompt set (the sampler's sources: the built-in suite, HumanEval, JSONL, local HF
datasets) through the episode player the evaluator stage uses (``evaluator/play.py``: the
generator's prompt rendering, sampling and per-sample seeds; the executor's sandbox, reward
rules, reference checks and episode rule), then reports per family: tasks, samples, pass@1 and
pass@k (the unbiased estimator of Chen et al. 2021, averaged over tasks), and format apart from
correctness (samples with a code block, that parse, that run; pass@1 among each), as a table on
stdout and as JSON.

A sample *passes* as an episode passes in training (``consumers/executor/episodes.py``): its last
turn ran cleanly and passed every test that ran (a chain: every step, one turn or more each).
``--tests`` picks the tests: the task's visible ``reward.tests``, its ``heldout_tests``, or
``all`` (both; the default; tasks without held-out tests use their visible ones).

The options are the ``[eval]`` section of the config (rollstream/config.py: EvalConfig); the
command's flags set its keys. The policy is a checkpoint directory (``--model DIR``, a Hugging
Face directory as the learner saves it) or the base model (default ``generator.model``).
Generation is deterministic given ``--seed``: sample i of task t uses seed
``derive_seed(seed, task_id, i)``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from rollstream.config import Config, EvalConfig
from rollstream.evaluator.play import Player, SampleResult
from rollstream.evaluator.report import pass_at_k, summarize

__all__ = ["SampleResult", "format_table", "pass_at_k", "run", "summarize"]

log = logging.getLogger(__name__)


def format_table(summary: Mapping[str, Mapping[str, Any]], ks: Sequence[int]) -> str:
    """A Markdown table of the summary (evaluator/report.py: summarize)."""
    from rollstream.cli.tables import table

    head = ["family", "tasks", "samples", *[f"pass@{k}" for k in ks], "tasks solved", "mean reward",
            "with code", "pass@1|code", "pass@1|parses", "pass@1|runs"]
    rows = []
    for family, row in summary.items():
        cells = [family, str(row["tasks"]), str(row["samples"])]
        cells += ["-" if row[f"pass@{k}"] is None else f"{row[f'pass@{k}']:.3f}" for k in ks]
        cells += [f"{row['tasks_solved']}/{row['tasks']}", f"{row['mean_reward']:.3f}"]
        cells += ["-" if row.get(key) is None else f"{row[key]:.3f}"
                  for key in ("with_code", "pass@1|code", "pass@1|parses", "pass@1|runs")]
        rows.append(cells)
    return table(head, rows, markdown=True)


def select_tasks(config: Config) -> list[Any]:
    from rollstream.tasks.sources import load_tasks, split_tasks

    options = config.eval
    tasks = load_tasks(options.sources or config.sampler.sources)
    if options.split != "all":
        trained, held_out = split_tasks(tasks, config.sampler.holdout_fraction, config.sampler.holdout_seed,
                                        near_threshold=config.intake.near_duplicate_threshold)
        if not held_out:
            raise ValueError("eval.split needs sampler.holdout_fraction > 0 (the split the run trained with)")
        tasks = held_out if options.split == "heldout" else trained
        check_split(options, held_out)
    if options.families:
        tasks = [t for t in tasks if t.family in options.families]
    if options.task_ids:
        tasks = [t for t in tasks if t.task_id in options.task_ids]
    if options.limit_per_family:
        taken: dict[str, int] = defaultdict(int)
        kept = []
        for t in tasks:
            if taken[t.family] < options.limit_per_family:
                taken[t.family] += 1
                kept.append(t)
        tasks = kept
    return tasks


def check_split(options: EvalConfig, held_out: Sequence[Any]) -> None:
    """With ``--run`` (``eval.heldout_digest``): the held-out split must be the one that run trained
    around, or nothing is reported."""
    if not options.heldout_digest:
        return
    from rollstream.errors import ConfigError
    from rollstream.evaluator.report import task_digest

    found = task_digest(t.task_id for t in held_out)
    if found != options.heldout_digest:
        raise ConfigError(f"the held-out split here ({found}) is not the one the run trained around "
                          f"({options.heldout_digest}): the sources or sampler.holdout_fraction/holdout_seed "
                          "differ from the run's (run.json records them); nothing is reported")


def run_heldout_digest(config: Config, run: str) -> str:
    """The held-out digest ``run.json`` of run ``run`` (an id under the state directory, or a run
    directory) recorded."""
    from rollstream.errors import ConfigError

    path = Path(run) if Path(run).is_dir() else Path(config.infra.state_dir) / "runs" / run
    try:
        digest = json.loads((path / "run.json").read_text()).get("heldout_digest")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--run {run}: cannot read {path / 'run.json'}: {exc}") from exc
    if not digest:
        raise ConfigError(f"--run {run}: its run.json records no held-out split (a run before this check, or "
                          "one without sampler.holdout_fraction)")
    return str(digest)


async def run(config: Config) -> dict[str, Any]:
    """Evaluate as ``config.eval`` says; prints the table, writes JSON (and completions) if
    asked, returns the report."""
    options = config.eval
    tasks = select_tasks(config)
    model = options.model or config.generator.model
    started = time.monotonic()
    if options.turns > 1 and options.resume:
        from rollstream.errors import ConfigError

        raise ConfigError("eval: --resume works with one turn only; drop --resume or --turns")
    results = previous_results(options, tasks)
    done = {(r.task_id, r.sample_index) for r in results}
    missing = [(t, i) for t in tasks for i in range(options.samples) if (t.task_id, i) not in done]
    tokens = 0
    if missing:
        if options.threads:
            import torch

            torch.set_num_threads(options.threads)
        from rollstream.consumers.generator.backends.hf import TransformersBackend

        backend = await asyncio.to_thread(TransformersBackend.load, model, config.generator.device,
                                          config.generator.dtype)
        log.info("loaded %s in %.0f s; %d samples to generate (%d tasks x %d, %d already scored)", model,
                 time.monotonic() - started, len(missing), len(tasks), options.samples, len(done))
        tokens = await generate_and_score(config, backend, missing, results)
    summary = summarize(results, options.ks)
    report = {
        "model": model, "sources": list(options.sources or config.sampler.sources), "tests": options.tests,
        "samples_per_task": options.samples, "seed": options.seed, "threads": options.threads,
        "sampling": {"temperature": config.generator.temperature, "top_p": config.generator.top_p,
                     "top_k": config.generator.top_k, "max_new_tokens": config.generator.max_new_tokens},
        "generated_tokens": tokens, "wall_s": round(time.monotonic() - started, 1), "families": summary,
        "turns": options.turns,
    }
    if options.turns > 1:  # pass@k after each number of turns, from one run (the last is `families`)
        report["families_by_turns"] = {str(t): summarize(r, options.ks)
                                       for t, r in sorted(after_turns(results, options.turns).items())}
        for t, turn_summary in report["families_by_turns"].items():
            print(f"after {t} turn{'s' if t != '1' else ''}:")
            print(format_table(turn_summary, options.ks))
    else:
        print(format_table(summary, options.ks))
    if options.json_out:
        Path(options.json_out).write_text(json.dumps(report, indent=2) + "\n")
    return report


async def generate_and_score(config: Config, backend: Any, missing: Sequence[tuple[Any, int]],
                             results: list[SampleResult]) -> int:
    """Play the missing samples (evaluator/play.py) and append their results to ``results`` (and to
    the completions file, as they come); returns the tokens generated."""
    options = config.eval
    from rollstream.consumers.executor.pool import DockerSandboxPool

    mode = "a" if options.resume else "w"
    completions_file = open(options.completions_out, mode) if options.completions_out else None  # noqa: SIM115

    def record(result: SampleResult) -> None:
        results.append(result)
        if completions_file:
            completions_file.write(json.dumps({
                "task_id": result.task_id, "family": result.family, "sample": result.sample_index,
                "passed": result.passed, "reward": result.reward, "error_kind": result.error_kind,
                "finish_reason": result.finish_reason, "completion_tokens": result.completion_tokens,
                "has_code": result.has_code, "parses": result.parses, "ran": result.ran, "turns": result.turns,
                "completion": result.completion}) + "\n")
            completions_file.flush()

    try:
        async with DockerSandboxPool(config.executor) as pool:
            player = Player(config, backend, pool, seed=options.seed, turns=options.turns, tests=options.tests,
                            batch=options.batch)
            await player.play(missing, on_result=record)
            return player.tokens
    finally:
        if completions_file:
            completions_file.close()


def after_turns(results: Sequence[SampleResult], turns: int) -> dict[int, list[SampleResult]]:
    """Each sample's verdict after 1, 2, ... turns: passed by then (an episode ends when it passes)."""
    import dataclasses

    return {t: [r if r.turns <= t else dataclasses.replace(r, passed=False) for r in results]
            for t in range(1, turns + 1)}


def previous_results(options: EvalConfig, tasks: Sequence[Any]) -> list[SampleResult]:
    """With ``resume``: the samples of the selected tasks already scored in ``completions_out``."""
    path = Path(options.completions_out) if options.completions_out else None
    if not options.resume or path is None or not path.exists():
        return []
    family = {t.task_id: t.family for t in tasks}
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["task_id"] in family and row["sample"] < options.samples:
            out[(row["task_id"], row["sample"])] = SampleResult(
                row["task_id"], family[row["task_id"]], row["sample"], row["passed"], row["reward"],
                row["error_kind"], row.get("finish_reason", "unknown"), row.get("completion_tokens", 0),
                has_code=row.get("has_code", True), parses=row.get("parses", True), ran=row.get("ran", True),
                turns=row.get("turns", 1))
    log.info("resuming: %d samples already scored in %s", len(out), path)
    return list(out.values())


# `rollstream eval` flag -> the eval key it sets (the flags are short for --set eval.KEY=VALUE).
FLAGS: dict[str, str] = {
    "model": "model", "sources": "sources", "families": "families", "task_ids": "task_ids", "split": "split",
    "limit_per_family": "limit_per_family", "samples": "samples", "turns": "turns", "k": "ks", "tests": "tests", "batch": "batch",
    "seed": "seed", "threads": "threads", "json_out": "json_out", "completions_out": "completions_out",
    "resume": "resume",
}


def register(name: str, parser: argparse.ArgumentParser) -> Any:
    if name == "compare":
        parser.add_argument("before", help="`rollstream eval --completions` output of the policy before")
        parser.add_argument("after", help="the same of the policy after")
        parser.add_argument("--json", dest="json_out", help="write the difference and its interval as JSON here")
        return lambda args, config: compare_main(args.before, args.after, args.json_out)
    add_arguments(parser)
    parser.set_defaults(config_overrides=eval_overrides)  # the flags stand for --set eval.KEY=VALUE
    return eval_command


def eval_command(args: argparse.Namespace, config: Config) -> int:
    """`rollstream eval` (the flags are already in ``config.eval``); with ``--run``, the run's
    held-out digest is the one the split must have."""
    if getattr(args, "run", None):
        config = msgspec.structs.replace(config, eval=msgspec.structs.replace(
            config.eval, heldout_digest=run_heldout_digest(config, args.run)))
    return asyncio.run(eval_main(config, args))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `rollstream eval` flags (the CLI adds --config/--set itself). Each sets one key of the
    [eval] section; unset flags leave the config's value."""
    parser.add_argument("--model", help="checkpoint directory or 'smollm2' (default: generator.model)")
    parser.add_argument("--source", action="append", dest="sources",
                        help="task source (repeatable): builtin, humaneval[:PATH], jsonl:PATH, hf:PATH "
                             "(default: sampler.sources)")
    parser.add_argument("--family", action="append", dest="families", help="only these families (repeatable)")
    parser.add_argument("--task", action="append", dest="task_ids", help="only these task ids (repeatable)")
    parser.add_argument("--split", choices=("all", "train", "heldout"),
                        help="the tasks sampler.holdout_fraction held out of training, the others, or all")
    parser.add_argument("--limit-per-family", type=int, help="first N tasks of each family (0 = all)")
    parser.add_argument("--samples", type=int, help="samples per task (n)")
    parser.add_argument("--turns", type=int, help="turns per sample, with the sandbox's feedback between them "
                                                  "(the report gives pass@k after 1, 2, ... turns)")
    parser.add_argument("--k", help="comma-separated k values of pass@k (each <= --samples)")
    parser.add_argument("--tests", choices=("all", "visible", "heldout"))
    parser.add_argument("--batch", type=int, help="completions per generate call")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--threads", type=int, help="torch threads (0 = torch default)")
    parser.add_argument("--json", dest="json_out", help="write the report as JSON here")
    parser.add_argument("--completions", dest="completions_out", help="write every completion and verdict (JSONL)")
    parser.add_argument("--run", dest="run", help="with --split heldout: the run (an id under the state "
                                                  "directory, or its directory) whose held-out split this must be")
    parser.add_argument("--resume", action="store_true", default=None,
                        help="keep the samples already in --completions and generate only the missing ones")


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """The ``eval.KEY=VALUE`` overrides the flags given on the command line stand for."""
    out = []
    for flag, key in FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        if flag == "k":
            value = [int(k) for k in str(value).split(",") if k.strip()]
        out.append(f"eval.{key}={msgspec.json.encode(value).decode()}")
    return out


def per_task_pass(path: Path) -> dict[str, tuple[str, float]]:
    """task id -> (family, fraction of its samples that passed), from an eval completions file
    (gzipped when its name ends in .gz)."""
    rows: dict[str, list[bool]] = defaultdict(list)
    family: dict[str, str] = {}
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        row = json.loads(line)
        rows[row["task_id"]].append(bool(row["passed"]))
        family[row["task_id"]] = row["family"]
    return {t: (family[t], sum(v) / len(v)) for t, v in rows.items()}


def bootstrap_difference(before: Mapping[str, float], after: Mapping[str, float], *, resamples: int = 10000,
                         seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """Mean over tasks of after - before (per-task pass@1), and its bootstrap confidence interval
    resampled over tasks (the tasks both sides evaluated)."""
    import random

    tasks = sorted(set(before) & set(after))
    if not tasks:
        raise ValueError("the two evaluations share no task")
    diffs = [after[t] - before[t] for t in tasks]
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(resamples))
    low, high = means[int((1 - level) / 2 * resamples)], means[int((1 + level) / 2 * resamples) - 1]
    return {"tasks": len(tasks), "before": sum(before[t] for t in tasks) / len(tasks),
            "after": sum(after[t] for t in tasks) / len(tasks), "difference": sum(diffs) / len(diffs),
            "ci_low": low, "ci_high": high, "level": level, "resamples": resamples}


def compare_main(before_path: str, after_path: str, json_out: str | None = None) -> int:
    """`rollstream compare BEFORE AFTER`: pass@1 per family before and after, and the difference
    over all tasks with its bootstrap 95% confidence interval (resampled over tasks)."""
    before, after = per_task_pass(Path(before_path)), per_task_pass(Path(after_path))
    overall = bootstrap_difference({t: v for t, (_, v) in before.items()}, {t: v for t, (_, v) in after.items()})
    families = sorted({f for f, _ in before.values()})
    from rollstream.cli.tables import table

    rows = []
    for family in families:
        tasks = [t for t, (f, _) in before.items() if f == family and t in after]
        rows.append([family, len(tasks), f"{sum(before[t][1] for t in tasks) / len(tasks):.3f}",
                     f"{sum(after[t][1] for t in tasks) / len(tasks):.3f}"])
    rows.append(["ALL", overall["tasks"], f"{overall['before']:.3f}", f"{overall['after']:.3f}"])
    print(table(["family", "tasks", "pass@1 before", "pass@1 after"], rows, markdown=True))
    print(f"difference {overall['difference']:+.3f}, 95% CI [{overall['ci_low']:+.3f}, {overall['ci_high']:+.3f}] "
          f"(bootstrap over {overall['tasks']} tasks, {overall['resamples']} resamples)")
    if json_out:
        Path(json_out).write_text(json.dumps(overall, indent=2) + "\n")
    return 0


async def eval_main(config: Config, args: argparse.Namespace) -> int:
    """`rollstream eval` at the resolved config (the flags are already in ``config.eval``)."""
    await run(config)
    return 0
