"""The pipeline's stages as subcommands (``rollstream sampler``, ``generator``, ...): each runs one
stage process with the resolved config; ``rollstream learner --nproc N`` becomes torchrun."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from typing import Any

from rollstream.errors import ConfigError
from rollstream.schemas.stages import STAGES

log = logging.getLogger("rollstream")

# stage -> (module, help), from the stage table (schemas/stages.py). Each module exposes
# ``async def run(config, **options) -> None``.
STAGE_COMMANDS: dict[str, tuple[str, str]] = {s.name: (s.module, s.summary) for s in STAGES}


def register(name: str, parser: argparse.ArgumentParser) -> Any:
    if name == "learner":
        parser.add_argument("--resume", action="store_true", help="continue exactly from the latest checkpoint")
        parser.add_argument("--nproc", type=int, default=None, metavar="N",
                            help="ranks on this machine (default learner.ranks): N > 1 starts them through "
                                 "torchrun (learner.parallel ddp or fsdp); several machines: run torchrun yourself "
                                 "(docs/learner.md)")
        parser.add_argument("--max-restarts", type=int, default=None, metavar="R",
                            help="N > 1: torchrun restarts every rank up to R times after one failed, each time "
                                 "resuming from the last checkpoint (default learner.max_restarts)")
    return run_stage


def run_stage(args: argparse.Namespace, config: Any) -> int:
    """Run the stage ``args.command`` until it stops (SIGTERM/SIGINT or its own end)."""
    from rollstream.config_load import to_toml
    from rollstream.infra import with_local_endpoints
    from rollstream.lifecycle import tune_gc

    if args.command == "learner":
        launch_ranks(args, config, args.argv)  # returns with one rank
    config = with_local_endpoints(config)  # once, here: stages get explicit endpoints
    log.info("resolved config:\n%s", to_toml(config))
    options = {"resume": args.resume} if args.command == "learner" else {}
    runner = importlib.import_module(STAGE_COMMANDS[args.command][0]).run  # the stage's heavy libraries
    tune_gc()
    try:
        asyncio.run(runner(config, **options))
    except asyncio.CancelledError:  # the stop bound abandoned the work in flight (see stop_event)
        log.warning("%s stopped with its in-flight work abandoned, uncommitted", args.command)
    return 0


def launch_ranks(args: argparse.Namespace, config: Any, argv: list[str]) -> None:
    """``rollstream learner`` with more than one rank on this machine: become torchrun (exec), which
    starts the ranks as ``rollstream learner`` (with the same arguments) and restarts them all
    after a failure (each restart resumes from the last checkpoint). Returns for one rank, and in
    a rank a launcher started."""
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
