"""`rollstream learner --nproc N` becomes torchrun with the ranks' arguments; one rank, or a rank a
launcher started, runs in process; the config refuses ranks without a parallel mode."""

from __future__ import annotations

import importlib
import sys

import pytest

from rollstream.config_load import load_config
from rollstream.errors import ConfigError

cli = importlib.import_module("rollstream.cli.main")  # the package exports its main() under the same name
stages = importlib.import_module("rollstream.cli.stages")

pytestmark = pytest.mark.unit


def launched(monkeypatch: pytest.MonkeyPatch, argv: list[str], world: str | None = None) -> list[str] | None:
    calls: list[list[str]] = []

    def fake_execv(path: str, args: list[str]) -> None:
        calls.append(args)
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", fake_execv)
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    args = cli.build_parser().parse_args(argv)
    config = load_config(None, args.overrides, environ={})
    try:
        stages.launch_ranks(args, config, argv)
    except SystemExit:
        pass
    return calls[0] if calls else None


def test_nproc_execs_torchrun_with_the_ranks_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    command = launched(monkeypatch, ["learner", "--resume", "--nproc", "2", "--max-restarts=5",
                                     "--set", "learner.parallel=fsdp"])
    assert command is not None
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=2" in command and "--max-restarts=5" in command and "--standalone" in command
    ranks_argv = command[command.index("rollstream.cli") + 1:]
    assert ranks_argv == ["learner", "--resume", "--set", "learner.parallel=fsdp", "--set", "learner.ranks=2"]


def test_config_ranks_and_max_restarts_are_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    command = launched(monkeypatch, ["learner", "--set", "learner.parallel=ddp", "--set", "learner.ranks=3",
                                     "--set", "learner.max_restarts=1"])
    assert command is not None and "--nproc-per-node=3" in command and "--max-restarts=1" in command


def test_one_rank_or_a_launched_rank_runs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launched(monkeypatch, ["learner"]) is None
    assert launched(monkeypatch, ["learner", "--nproc", "1"]) is None
    assert launched(monkeypatch, ["learner", "--nproc", "2", "--set", "learner.parallel=fsdp"], world="2") is None


def test_ranks_need_a_parallel_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="learner.parallel"):
        launched(monkeypatch, ["learner", "--nproc", "2"])
    with pytest.raises(ConfigError, match="learner.parallel"):
        load_config(None, ["learner.ranks=2"], environ={})
    with pytest.raises(ConfigError, match="nccl"):
        load_config(None, ["learner.dist_backend=nccl"], environ={})
    config = load_config(None, ["learner.ranks=4", "learner.parallel=fsdp", "weights.store=s3://b/w"], environ={})
    assert (config.learner.ranks, config.learner.parallel, config.weights.store) == (4, "fsdp", "s3://b/w")
