"""Trivial programs a task's tests must fail (``rollstream tasks check``, issue 36).

Mutating a one-line reference yields one or two mutants, both killed, so mutation alone calls a
task clean whose tests a program that does nothing passes. Here each function task meets the
programs a weak test suite lets through:

* return each argument (the identity among them);
* return each constant that appears in the tests (expected values first);
* return the empty value of the result's type (the types of the values the tests expect), and
  ``None``.

Each is decided without a sandbox when every test is a plain comparison of a call with literal
arguments against a literal (``assert f(1, [2]) == 3``, ``assert f(x) is None``,
``assert not f(x)``): the program's result is a literal then, and comparing literals runs no
code of the task. Otherwise it runs in the sandbox like any completion. A program that passes
every test is then compared with the reference on the varied inputs intake derives for
equivalence (``rollstream/tasks/mutants.py``): one that differs somewhere means the tests are
weak (the input is the test to add); one that agrees everywhere means the task is that trivial.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import msgspec

from rollstream.tasks.mutants import call_arguments

MAX_CONSTANTS = 12
MAX_REPR = 2000
EMPTY: dict[type, Any] = {list: [], tuple: (), dict: {}, set: set(), frozenset: frozenset(), str: "", int: 0,
                          float: 0.0, bool: False, bytes: b""}
_UNDECIDED = object()


class Trivial(msgspec.Struct, frozen=True, kw_only=True):
    """One trivial program: what it does (``name``) and its source (defines the entry point)."""

    name: str
    source: str
    returns: Any = None  # the value it returns (``argument`` is None)
    argument: int | None = None  # returns its argument at this position


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return _UNDECIDED


def _parsed(tests: list[str]) -> list[ast.Module]:
    out = []
    for test in tests:
        try:
            out.append(ast.parse(test))
        except (SyntaxError, ValueError, RecursionError):
            continue
    return out


def _constants(trees: list[ast.Module], entry_point: str) -> list[Any]:
    """Literal values in the tests, those compared with a call of the entry point first."""
    expected, others = [], []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and len(node.comparators) == 1:
                sides = [node.left, node.comparators[0]]
                if any(_calls(side, entry_point) for side in sides):
                    expected += [v for v in map(_literal, sides) if v is not _UNDECIDED]
            if isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set)):
                value = _literal(node)
                if value is not _UNDECIDED:
                    others.append(value)
    found: list[Any] = []
    for value in [*expected, *others]:
        if isinstance(value, str) and value.startswith("__"):
            continue
        if len(repr(value)) <= MAX_REPR and not any(type(value) is type(v) and value == v for v in found):
            found.append(value)
    return found[:MAX_CONSTANTS]


def _calls(node: ast.AST, entry_point: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point


def _arity(calls: list[tuple[tuple, dict]], reference: str, entry_point: str) -> int:
    arity = max((len(args) for args, _ in calls), default=0)
    try:
        tree = ast.parse(reference)
    except (SyntaxError, ValueError, RecursionError):
        return arity
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            arity = max(arity, len(node.args.posonlyargs) + len(node.args.args))
    return arity


def trivial_programs(entry_point: str, tests: list[str], reference: str = "") -> list[Trivial]:
    """The trivial programs for a function task (none when it has no entry point)."""
    if not entry_point.isidentifier():
        return []
    trees = _parsed(tests)
    calls = call_arguments(tests, entry_point)
    head = f"def {entry_point}(*args, **kwargs):\n    return "
    programs = [Trivial(name=f"return argument {i}" + (" (the identity)" if i == 0 else ""),
                        source=f"{head}args[{i}]\n", argument=i)
                for i in range(min(_arity(calls, reference, entry_point), 8))]
    constants = _constants(trees, entry_point)
    values = [*constants, None, *(EMPTY[t] for t in dict.fromkeys(type(v) for v in constants) if t in EMPTY)]
    seen: list[Any] = []
    for value in values:
        if any(type(value) is type(v) and value == v for v in seen):
            continue
        seen.append(value)
        programs.append(Trivial(name=f"return {value!r}"[:200], source=f"{head}{value!r}\n", returns=value))
    return programs


_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not}


def decide(program: Trivial, tests: list[str], entry_point: str) -> bool | None:
    """Whether ``program`` passes every test, decided without running it: None when some test is
    not a plain comparison of a literal call of the entry point with a literal."""
    for test in tests:
        try:
            tree = ast.parse(test)
        except (SyntaxError, ValueError, RecursionError):
            return None
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
            return None
        verdict = _assertion(program, tree.body[0].test, entry_point)
        if verdict is None:
            return None
        if not verdict:
            return False
    return True


def _assertion(program: Trivial, node: ast.AST, entry_point: str) -> bool | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _assertion(program, node.operand, entry_point)
        return None if inner is None else not inner
    if _calls(node, entry_point):
        value = _result(program, node)
        return None if value is _UNDECIDED else bool(value)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        left, right = node.left, node.comparators[0]
        if _calls(right, entry_point):
            left, right = right, left
        if not _calls(left, entry_point):
            return None
        got, want = _result(program, left), _literal(right)
        if got is _UNDECIDED or want is _UNDECIDED:
            return None
        if isinstance(node.ops[0], (ast.Is, ast.IsNot)) and not any(want is c for c in (None, True, False)):
            return None  # identity of other values is the interpreter's business
        try:
            return bool(_COMPARE[type(node.ops[0])](got, want))
        except Exception:  # comparing literals of odd types: let the sandbox say
            return None
    return None


def _result(program: Trivial, call: ast.AST) -> Any:
    """What ``program`` returns for ``call`` (a literal call), or _UNDECIDED (it would raise, or
    the arguments are not literals)."""
    assert isinstance(call, ast.Call)
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return _UNDECIDED
    if program.argument is None:
        return program.returns
    if program.argument >= len(call.args):
        return _UNDECIDED  # an IndexError: the sandbox would say the test fails; let it
    return _literal(call.args[program.argument])
