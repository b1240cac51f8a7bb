"""The ``rollstream`` command line.

Parsing and config resolution happen here; every heavy library (torch, transformers, faust,
aiodocker) is imported only inside the subcommand that needs it, so ``rollstream --help``
stays fast.

Examples (each line is parsed by a test)::

    rollstream run --max-steps 4                      # a short real GRPO run on this machine
    rollstream config show --set rl.group_size=4      # the configuration a run would use
    rollstream score tasks.jsonl completions.jsonl     # verdicts through the sandbox, no Kafka
    rollstream learner --config prod.toml             # one stage, as a deployment runs it
    rollstream inspect GROUP_ID                       # a group from the run's archive
    rollstream eval --split heldout                   # pass@1 per family on unseen tasks
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rollstream.cli.stages import STAGE_COMMANDS
from rollstream.config_load import load_config, profile_path
from rollstream.errors import RollstreamError

log = logging.getLogger("rollstream")

Handler = Callable[[argparse.Namespace, Any], int]
"""A subcommand's handler: ``(parsed arguments, resolved Config) -> exit status``."""

# command -> (the module that registers it, its one-line help). Each module has
# ``register(name, parser) -> Handler``: it adds the command's arguments to ``parser`` and returns
# its handler. Only the module of the command being run is imported (heavy libraries load inside
# the handlers), so ``rollstream --help`` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("rollstream.cli.run", "run the whole pipeline locally: a short real GRPO run"),
    "config": ("rollstream.cli.basics", "show the resolved configuration"),
    "infra": ("rollstream.cli.basics", "local broker and Redis on loopback"),
    "topics": ("rollstream.cli.basics", "create every registry topic (and its .dlq)"),
    **{name: ("rollstream.cli.stages", help_text) for name, (_, help_text) in STAGE_COMMANDS.items()},
    "score": ("rollstream.cli.basics", "score completions offline through the real sandbox (no Kafka)"),
    "tasks": ("rollstream.cli.intake", "task intake: check tasks (reference and wrong solutions, mutants, "
                                       "duplicates, contamination, personal data) and write the report the sampler reads"),
    "sandbox": ("rollstream.cli.basics", "build the sandbox image; doctor: which runtimes (runc, runsc) run it here"),
    "image": ("rollstream.cli.compose_images", "the images of the compose deployment: base [--offline], build [--offline]"),
    "plot": ("rollstream.cli.basics", "draw reward and pass rate per learner step of one run or several"),
    "compare": ("rollstream.cli.evaluate", "pass@1 before and after (two eval completion files), with a bootstrap CI"),
    "replay": ("rollstream.cli.replay", "re-score recorded actions (archive or live topics) with the current reward "
                                        "code and report what changed"),
    "verify": ("rollstream.cli.verify", "check every archived verdict's signature and claims, and re-score a sample "
                                        "(docs/executor.md, \"Attested verdicts\")"),
    "keys": ("rollstream.cli.verify", "keys new --dir DIR [--id ID]: an Ed25519 key pair for signing verdicts"),
    "inspect": ("rollstream.cli.records", "one group (or rollout) as the run archive holds it: prompt, completions, "
                                          "verdicts, advantages, and what the learner did with it"),
    "runs": ("rollstream.cli.records", "the runs under the state directory: steps, version, groups, archive"),
    "eval": ("rollstream.cli.evaluate", "pass@1 / pass@k per task family at a fixed policy"),
}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", help="TOML config file (default: $ROLLSTREAM_CONFIG)")
    parser.add_argument("--profile", help="a TOML file of defaults under the config: a shipped name ('quick', "
                                          "what `rollstream run` uses unless told otherwise) or a path")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (repeatable)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``argv``, only the command it names registers its
    arguments and handler (the others are listed with their help), else every command does."""
    parser = argparse.ArgumentParser(
        prog="rollstream", description="Asynchronous RL post-training with execution feedback, over Kafka."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        _common(p)
        if chosen is None or chosen == name:
            p.set_defaults(handler=importlib.import_module(module).register(name, p))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    args.argv = argv  # what `rollstream learner --nproc N` hands its ranks
    from rollstream.lifecycle import setup_logging

    setup_logging(args.log_level)
    try:
        profile = profile_path(args.profile) if args.profile else None
        config_overrides = getattr(args, "config_overrides", None)  # flags that stand for --set KEY=VALUE
        overrides = [*args.overrides, *(config_overrides(args) if config_overrides else [])]
        return args.handler(args, load_config(args.config, overrides, profile=profile))
    except RollstreamError as exc:
        print(f"rollstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
