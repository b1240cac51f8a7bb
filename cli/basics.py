"""The small subcommands: ``config``, ``infra``, ``topics``, ``score``, ``sandbox`` and ``plot``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from rollstream.config import Config
from rollstream.errors import ConfigError


def register(name: str, parser: argparse.ArgumentParser) -> Any:
    if name == "config":
        parser.add_argument("action", choices=["show"], help="show: print the resolved config as TOML")
        parser.add_argument("--run", help="print what this run used instead (a run id under infra.state_dir/runs, "
                                          "or its directory): the config.toml `rollstream run` wrote")
        return show_config
    if name == "infra":
        parser.add_argument("action", choices=["up", "status", "down"])
        return infra_command
    if name == "topics":
        parser.add_argument("action", choices=["create"])
        return create_topics
    if name == "score":
        parser.add_argument("inputs", nargs="+", help="TASKS.jsonl COMPLETIONS.jsonl, or one JSONL of {task, completion}")
        parser.add_argument("--output", "-o", default="-", help="where to write one JSON verdict per line (default stdout)")
        return score
    if name == "sandbox":
        parser.add_argument("action", choices=["build", "doctor", "asset-digest"],
                            help="build: the sandbox image; doctor: which runtimes (runc, runsc) run it here, and why not; "
                                 "asset-digest PATH: the digest a task's RewardSpec.assets entry pins for a local file or "
                                 "directory")
        parser.add_argument("path", nargs="?", help="asset-digest: the file or directory")
        parser.add_argument("--offline", action="store_true", help="build: debootstrap + docker import (no registry needed)")
        parser.add_argument("--tag", default=None, help="build: image tag (default: executor.image; with --languages "
                                                         "rollstream-sandbox-polyglot:latest for all six, else the "
                                                         "languages joined: rollstream-sandbox-c-cpp:latest)")
        parser.add_argument("--languages", default=None, metavar="LIST",
                            help="build: a second image with Debian's compilers of these languages besides Python, "
                                 "comma-separated: c, cpp, java, javascript, go, rust (always debootstrap + docker "
                                 "import; default: Python alone, today's image)")
        parser.add_argument("--json", action="store_true", help="doctor: one JSON object instead of the table")
        return sandbox
    if name == "plot":
        parser.add_argument("runs", nargs="+", metavar="RUN", help="a run directory, or a run id under infra.state_dir/runs")
        parser.add_argument("--output", "-o", help="the PNG to write (default: the run's reward.png; runs.png for several)")
        parser.add_argument("--window", type=int, default=5, help="steps of the moving average (default 5)")
        return plot_runs
    raise AssertionError(name)


def show_config(args: argparse.Namespace, config: Config) -> int:
    from rollstream.cli.records import run_paths
    from rollstream.cli.run import CONFIG_FILE
    from rollstream.config_load import to_toml

    if args.run:
        run, _ = run_paths(config, args.run)
        if not (run / CONFIG_FILE).is_file():
            raise ConfigError(f"--run {args.run}: no {run / CONFIG_FILE} (a run directory of `rollstream run`; runs "
                              "before this file was written have only run.json)")
        print((run / CONFIG_FILE).read_text(), end="")
        return 0
    print(to_toml(config), end="")
    return 0


def infra_command(args: argparse.Namespace, config: Config) -> int:
    from rollstream import infra

    if args.action == "up":
        state = infra.up(config.infra)
        print(json.dumps({k: v for k, v in state.items() if k != "processes"}, indent=2))
        for name, rec in state["processes"].items():
            print(f"{name}: pid {rec['pid']}, log {rec['log']}")
        return 0
    if args.action == "status":
        report = infra.status(config.infra)
        print(json.dumps(report, indent=2))
        healthy = report.get("kafka_healthy") and report.get("redis_healthy")
        return 0 if healthy else 1
    stopped = infra.down(config.infra)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing (no process of ours was running)"))
    return 0


def create_topics(args: argparse.Namespace, config: Config) -> int:
    from rollstream.infra import with_local_endpoints
    from rollstream.kafka import ensure_topics
    from rollstream.schemas import TOPICS

    config = with_local_endpoints(config)
    asyncio.run(ensure_topics(config.infra, list(TOPICS)))
    print("topics ready:", ", ".join(config.infra.topic_prefix + t for t in TOPICS))
    return 0


def score(args: argparse.Namespace, config: Config) -> int:
    from rollstream.consumers.executor.score import score_main

    return asyncio.run(score_main(config, args.inputs, args.output))


def sandbox(args: argparse.Namespace, config: Config) -> int:
    if args.action == "asset-digest":
        from rollstream.consumers.executor.assets import local_digest

        if not args.path or not os.path.exists(args.path):
            raise ConfigError(f"asset-digest needs an existing file or directory (got {args.path!r})")
        print(local_digest(args.path))
        return 0
    if args.action == "doctor":
        from rollstream.consumers.executor.doctor import doctor, report, sandbox_images

        checks = asyncio.run(doctor(config.executor))
        images = asyncio.run(sandbox_images(config.executor))
        text, status = report(checks, config.executor.runtime, args.json, images)
        print(text)
        return status
    from rollstream.consumers.executor.image import build_image, build_plan

    plan = build_plan(args.languages, args.tag)
    if plan.languages:
        build_image(tag=plan.tag, offline=True, languages=plan.languages)
        print(f"built sandbox image {plan.tag} (python, {', '.join(plan.languages)})")
        return 0
    tag = args.tag or config.executor.image
    build_image(tag=tag, offline=args.offline)
    print(f"built sandbox image {tag}")
    return 0


def plot_runs(args: argparse.Namespace, config: Config) -> int:
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
