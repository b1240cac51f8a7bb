"""The ``rollstream`` command line.

Parsing and config resolution happen here; every heavy library (torch, transformers, faust,
aiodocker) is imported only inside the subcommand that needs it, so ``rollstream --help``
stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rollstream.config import Config
from rollstream.config_load import load_config, profile_path, to_toml
from rollstream.errors import ConfigError, RollstreamError

log = logging.getLogger("rollstream")

# stage -> (module, help). Each module exposes ``async def run(config, **options) -> None``.
STAGES: dict[str, tuple[str, str]] = {
    "sampler": ("rollstream.producers.sampler", "publish PromptIssued events from task sources"),
    "generator": ("rollstream.consumers.generator.stage", "turn prompts into G completions each (transformers or SGLang)"),
    "executor": ("rollstream.consumers.executor.stage", "run completions in Docker sandboxes and score them"),
    "stream": ("rollstream.streams.advantages", "gather each group's rewards and compute advantages (Faust)"),
    "learner": ("rollstream.learner.train", "train the policy on advantages and broadcast weights"),
    "archiver": ("rollstream.consumers.archiver.stage", "sink every topic of a run into the run archive (Parquet)"),
    "evaluator": ("rollstream.evaluator.stage", "held-out pass@k of the policy versions a run publishes (evals)"),
}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="TOML config file (default: $ROLLSTREAM_CONFIG)")
    parser.add_argument("--profile", help="a TOML file of defaults under the config: a shipped name ('quick', "
                                          "what `rollstream run` uses unless told otherwise) or a path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollstream", description="Asynchronous RL post-training with execution feedback, over Kafka."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the whole pipeline locally: a short real GRPO run")
    _common(p)
    p.add_argument("--max-steps", type=int, default=4, help="optimizer steps to train (default 4)")
    p.add_argument("--max-minutes", type=float, default=0.0,
                   help="also stop after this many minutes from the start of the run: the learner finishes "
                        "its step, checkpoints and exits (default 0: no time limit)")
    p.add_argument("--executors", type=int, default=1, help="executor processes")
    p.add_argument("--generators", type=int, default=1, help="generator processes")
    p.add_argument("--learner-ranks", type=int, default=1, metavar="N",
                   help="learner ranks (torchrun; learner.parallel, fsdp unless set); default 1")
    p.add_argument("--keep-infra", action="store_true", help="leave the local broker/Redis running afterwards")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="start the evaluator: held-out pass@1 per family of every N-th policy version and of "
                        "the last (eval.every_versions; on the evals topic, the status line and the plot)")
    p.add_argument("--placement", choices=["split", "none"], default="split",
                   help="split (default): the learner and the generator get disjoint CPU cores when both run "
                        "torch on this CPU (rollstream/cpus.py); none: the kernel places them")

    p = sub.add_parser("config", help="show the resolved configuration")
    _common(p)
    p.add_argument("action", choices=["show"], help="show: print the resolved config as TOML")

    p = sub.add_parser("infra", help="local broker and Redis on loopback")
    _common(p)
    p.add_argument("action", choices=["up", "status", "down"])

    p = sub.add_parser("topics", help="create every registry topic (and its .dlq)")
    _common(p)
    p.add_argument("action", choices=["create"])

    for name, (_, help_text) in STAGES.items():
        p = sub.add_parser(name, help=help_text)
        _common(p)
        if name == "learner":
            p.add_argument("--resume", action="store_true", help="continue exactly from the latest checkpoint")
            p.add_argument("--nproc", type=int, default=None, metavar="N",
                           help="ranks on this machine (default learner.ranks): N > 1 starts them through "
                                "torchrun (learner.parallel ddp or fsdp); several machines: run torchrun yourself "
                                "(docs/learner.md)")
            p.add_argument("--max-restarts", type=int, default=None, metavar="R",
                           help="N > 1: torchrun restarts every rank up to R times after one failed, each time "
                                "resuming from the last checkpoint (default learner.max_restarts)")

    p = sub.add_parser("score", help="score completions offline through the real sandbox (no Kafka)")
    _common(p)
    p.add_argument("inputs", nargs="+", help="TASKS.jsonl COMPLETIONS.jsonl, or one JSONL of {task, completion}")
    p.add_argument("--output", "-o", default="-", help="where to write one JSON verdict per line (default stdout)")

    p = sub.add_parser("tasks", help="task intake: check tasks (reference and wrong solutions, mutants, duplicates, "
                                     "contamination, personal data) and write the report the sampler reads")
    _common(p)
    p.add_argument("action", choices=["check"], help="check: run every check and write the intake report")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="task sources: builtin, jsonl:PATH, humaneval, hf:PATH")
    p.add_argument("--quick", action="store_true", help="at most 6 mutants per task (intake.max_mutants otherwise)")
    p.add_argument("--json", dest="json_out", help="write this run's checks (and clusters) as JSON here")
    p.add_argument("--verbose", "-v", action="store_true", help="show every surviving mutant of a weak task")

    p = sub.add_parser("sandbox", help="build the sandbox image")
    _common(p)
    p.add_argument("action", choices=["build"])
    p.add_argument("--offline", action="store_true", help="debootstrap + docker import (no registry needed)")
    p.add_argument("--tag", default=None, help="image tag (default: executor.image)")

    p = sub.add_parser("image", help="the images of the compose deployment: base [--offline], build [--offline]")
    _common(p)
    from rollstream.cli.compose_images import (
        add_arguments as add_image_arguments,  # argparse only: stays fast
    )

    add_image_arguments(p)

    p = sub.add_parser("plot", help="draw reward and pass rate per learner step of one run or several")
    _common(p)
    p.add_argument("runs", nargs="+", metavar="RUN", help="a run directory, or a run id under infra.state_dir/runs")
    p.add_argument("--output", "-o", help="the PNG to write (default: the run's reward.png; runs.png for several)")
    p.add_argument("--window", type=int, default=5, help="steps of the moving average (default 5)")

    p = sub.add_parser("compare", help="pass@1 before and after (two eval completion files), with a bootstrap CI")
    _common(p)
    p.add_argument("before", help="`rollstream eval --completions` output of the policy before")
    p.add_argument("after", help="the same of the policy after")
    p.add_argument("--json", dest="json_out", help="write the difference and its interval as JSON here")

    p = sub.add_parser("replay", help="re-score recorded actions (archive or live topics) with the current reward "
                                      "code and report what changed")
    _common(p)
    from rollstream.cli.replay import add_arguments as add_replay_arguments  # argparse only: stays fast

    add_replay_arguments(p)

    p = sub.add_parser("verify", help="check every archived verdict's signature and claims, and re-score a sample "
                                      "(docs/executor.md, \"Attested verdicts\")")
    _common(p)
    from rollstream.cli.verify import add_arguments as add_verify_arguments

    add_verify_arguments(p)

    p = sub.add_parser("keys", help="keys new --dir DIR [--id ID]: an Ed25519 key pair for signing verdicts")
    _common(p)
    from rollstream.cli.verify import add_keys_arguments

    add_keys_arguments(p)

    p = sub.add_parser("inspect", help="one group (or rollout) as the run archive holds it: prompt, completions, "
                                       "verdicts, advantages, and what the learner did with it")
    _common(p)
    from rollstream.cli.records import add_inspect_arguments

    add_inspect_arguments(p)

    p = sub.add_parser("runs", help="the runs under the state directory: steps, version, groups, archive")
    _common(p)
    p.add_argument("--json", action="store_true", help="print JSON for tools")

    p = sub.add_parser("eval", help="pass@1 / pass@k per task family at a fixed policy")
    _common(p)
    from rollstream.cli.evaluate import add_arguments  # argparse only: stays fast

    add_arguments(p)
    return parser


def launch_ranks(args: argparse.Namespace, config: Config, argv: list[str]) -> None:
    """``rollstream learner`` with more than one rank on this machine: become torchrun (exec), which
    starts the ranks as ``rollstream learner`` (with the same arguments) and restarts them all
    after a failure (each restart resumes from the last checkpoint). Returns for one rank, and in
    a rank a launcher started."""
    import os

    nproc = args.nproc if args.nproc is not None else config.learner.ranks
    if nproc <= 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return
    if config.learner.parallel == "none":
        raise ConfigError(f"--nproc {nproc}: set learner.parallel = 'ddp' or 'fsdp' (--set learner.parallel=fsdp)")
    restarts = args.max_restarts if args.max_restarts is not None else config.learner.max_restarts
    rest, skip = [], False
    for item in argv:  # the ranks get every argument but the launcher's own
        if skip:
            skip = False
        elif item in ("--nproc", "--max-restarts"):
            skip = True
        elif not item.startswith(("--nproc=", "--max-restarts=")):
            rest.append(item)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               f"--max-restarts={restarts}", "-m", "rollstream.cli", *rest, "--set", f"learner.ranks={nproc}"]
    log.info("starting %d learner ranks: %s", nproc, " ".join(command))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def _stage_runner(name: str) -> Callable[..., Any]:
    module, _ = STAGES[name]
    return importlib.import_module(module).run


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rollstream.lifecycle import setup_logging

    setup_logging(args.log_level)
    try:
        profile = profile_path(args.profile) if args.profile else None
        overrides = list(args.overrides)
        if args.command == "eval":
            from rollstream.cli.evaluate import eval_overrides

            overrides += eval_overrides(args)  # the flags are short for --set eval.KEY=VALUE
        config = load_config(args.config, overrides, profile=profile)
        if args.command == "eval" and getattr(args, "run", None):
            from rollstream.cli.evaluate import run_heldout_digest

            config = load_config(args.config, [*overrides, f"eval.heldout_digest={run_heldout_digest(config, args.run)}"],
                                 profile=profile)
        if args.command == "learner":
            launch_ranks(args, config, list(sys.argv[1:] if argv is None else argv))  # returns with one rank
        return dispatch(args, config)
    except RollstreamError as exc:
        print(f"rollstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def dispatch(args: argparse.Namespace, config: Config) -> int:
    command = args.command
    if command == "config":
        print(to_toml(config), end="")
        return 0
    if command == "infra":
        return _infra(args.action, config)
    if command == "topics":
        from rollstream.infra import with_local_endpoints
        from rollstream.kafka import ensure_topics
        from rollstream.schemas import TOPICS

        config = with_local_endpoints(config)
        asyncio.run(ensure_topics(config.infra, list(TOPICS)))
        print("topics ready:", ", ".join(config.infra.topic_prefix + t for t in TOPICS))
        return 0
    if command in STAGES:
        from rollstream.infra import with_local_endpoints

        config = with_local_endpoints(config)  # once, here: stages get explicit endpoints
        log.info("resolved config:\n%s", to_toml(config))
        options = {"resume": args.resume} if command == "learner" else {}
        runner = _stage_runner(command)  # imports the stage's heavy libraries
        from rollstream.lifecycle import tune_gc

        tune_gc()
        try:
            asyncio.run(runner(config, **options))
        except asyncio.CancelledError:  # the stop bound abandoned the work in flight (see stop_event)
            log.warning("%s stopped with its in-flight work abandoned, uncommitted", command)
        return 0
    if command == "run":
        from rollstream.cli.run import run_pipeline

        return run_pipeline(config, args)
    if command == "score":
        from rollstream.consumers.executor.score import score_main

        return asyncio.run(score_main(config, args.inputs, args.output))
    if command == "tasks":
        from rollstream.cli.intake import check_main

        return check_main(config, args)
    if command == "sandbox":
        from rollstream.consumers.executor.image import build_image

        tag = args.tag or config.executor.image
        build_image(tag=tag, offline=args.offline)
        print(f"built sandbox image {tag}")
        return 0
    if command == "image":
        from rollstream.cli.compose_images import image_main

        return image_main(args)
    if command == "plot":
        return _plot(args, config)
    if command == "compare":
        from rollstream.cli.evaluate import compare_main

        return compare_main(args.before, args.after, args.json_out)
    if command == "replay":
        from rollstream.cli.replay import replay_main

        return asyncio.run(replay_main(config, args))
    if command == "keys":
        from rollstream.cli.verify import keys_main

        return keys_main(args)
    if command == "verify":
        from rollstream.cli.verify import verify_main

        return asyncio.run(verify_main(config, args))
    if command == "inspect":
        from rollstream.cli.records import inspect_main

        return inspect_main(config, args)
    if command == "runs":
        from rollstream.cli.records import runs_main

        return runs_main(config, args.json)
    if command == "eval":
        from rollstream.cli.evaluate import eval_main

        return asyncio.run(eval_main(config, args))
    raise AssertionError(command)


def _plot(args: argparse.Namespace, config: Config) -> int:
    from pathlib import Path

    from rollstream.cli.watch import METRICS_FILE, PLOT_FILE, plot

    runs = []
    for name in args.runs:
        run = Path(name)
        if not run.exists():
            run = Path(config.infra.state_dir) / "runs" / name
        if not (run / METRICS_FILE).is_file():
            raise ConfigError(f"{name}: no {METRICS_FILE} there (a run directory written by `rollstream run`, "
                              f"or a run id under {config.infra.state_dir}/runs)")
        runs.append(run)
    out = Path(args.output) if args.output else (runs[0] / PLOT_FILE if len(runs) == 1 else Path("runs.png"))
    print(f"wrote {plot(runs, out, window=args.window)}")
    return 0


def _infra(action: str, config: Config) -> int:
    from rollstream import infra

    if action == "up":
        state = infra.up(config.infra)
        print(json.dumps({k: v for k, v in state.items() if k != "processes"}, indent=2))
        for name, rec in state["processes"].items():
            print(f"{name}: pid {rec['pid']}, log {rec['log']}")
        return 0
    if action == "status":
        report = infra.status(config.infra)
        print(json.dumps(report, indent=2))
        healthy = report.get("kafka_healthy") and report.get("redis_healthy")
        return 0 if healthy else 1
    stopped = infra.down(config.infra)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing (no process of ours was running)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
