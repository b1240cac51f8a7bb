"""Every subcommand is registered by its own module (its arguments and its handler), and only the
module of the command being run is imported."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from rollstream.cli.main import COMMANDS, build_parser

pytestmark = pytest.mark.unit


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_registers_a_handler() -> None:
    parsers = subparsers(build_parser())
    assert set(parsers) == set(COMMANDS)
    for name, parser in parsers.items():
        assert callable(parser.get_default("handler")), name


def test_only_the_chosen_commands_module_is_imported() -> None:
    code = ("import sys; from rollstream.cli.main import build_parser; "
            "args = build_parser(['runs', '--json']).parse_args(['runs', '--json']); "
            "print(args.handler is not None, sorted(m for m in sys.modules if m.startswith('rollstream.cli.')), "
            "'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True ['rollstream.cli.main', 'rollstream.cli.records', 'rollstream.cli.stages'] False"


def test_a_command_without_its_arguments_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    from rollstream.cli.main import main

    with pytest.raises(SystemExit):
        main(["inspect"])
    assert "GROUP_ID" in capsys.readouterr().err


def test_sandbox_asset_digest_prints_what_a_task_pins(capsys: pytest.CaptureFixture[str]) -> None:
    from rollstream.cli.main import main
    from rollstream.tasks.outside import LEVELS_DIGEST
    from rollstream.tasks.sources import ASSETS_DIR

    assert main(["sandbox", "asset-digest", str(ASSETS_DIR / "levels")]) == 0
    assert capsys.readouterr().out.strip() == LEVELS_DIGEST
    assert main(["sandbox", "asset-digest", str(ASSETS_DIR / "nope")]) == 2
    assert "existing file or directory" in capsys.readouterr().err
