"""The examples in the public entry points' docstrings work: the Python ones run as doctests, and
every ``rollstream ...`` line of the command's docstring parses (its command and flags exist)."""

from __future__ import annotations

import doctest
import importlib
import re
import shlex

import pytest

cli_main = importlib.import_module("rollstream.cli.main")  # the package's ``main`` is the function

pytestmark = pytest.mark.unit

# The public entry points whose docstrings carry a runnable example.
EXAMPLES = [
    ("rollstream.consumers.executor.rewards", "RewardRegistry"),
    ("rollstream.tasks.sources", "load_tasks"),
    ("rollstream.learner.trainer", "Trainer"),
]


@pytest.mark.parametrize(("module", "name"), EXAMPLES)
def test_the_docstring_example_runs(module: str, name: str) -> None:
    obj = getattr(importlib.import_module(module), name)
    [test] = doctest.DocTestFinder(recurse=False).find(obj, name, globs={})
    assert test.examples, f"{module}.{name} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_every_command_line_example_parses() -> None:
    lines = [m.group(1) for m in re.finditer(r"^\s+rollstream (.+?)(?:\s+#.*)?$", cli_main.__doc__ or "", re.M)]
    assert len(lines) >= 5
    for line in lines:
        argv = shlex.split(line)
        args = cli_main.build_parser(argv).parse_args(argv)
        assert args.command == argv[0] and callable(args.handler), line
