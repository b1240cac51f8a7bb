"""Mutants of a reference solution, and the inputs that tell a surviving mutant from the reference.

Pure code (no I/O): ``rollstream tasks check`` runs what this makes through the executor's
sandbox pool. Our own AST pass rather than ``mutmut`` or ``cosmic-ray``: both mutate files on
disk and drive a test runner (pytest, a work database) in the host process, while a task's
reference is a string whose tests must run in the sandbox's judge; their operator sets are
what this pass implements, on ``ast`` nodes, with each mutant unparsed back to source:

* ``arith``: ``+ -``, ``* //``, ``/ *``, ``% //``, ``** *``, ``<< >>``, ``& |``, ``^ |`` (and in ``+=``...)
* ``compare``: ``< <=``, ``> >=``, ``== !=``, ``in`` / ``not in``, ``is`` / ``is not``
  (``< <=`` and ``> >=`` are the boundary mutants)
* ``boolean``: ``and or``, ``not x`` -> ``x``, ``-x`` -> ``x``
* ``constant``: an int ``k`` -> ``k + 1`` and ``k - 1``, ``True False``, a string -> ``''``
  (an empty one -> ``'x'``)
* ``return``: ``return x`` -> ``return None``
* ``statement``: a statement (assignment, call, ``if``, loop, ``raise``, ...) removed (``pass``)

Docstrings, annotations and ``import`` lines are never mutated; mutants equal (as source) to the
reference or to one another are made once. :func:`mutants` keeps at most ``limit`` of them,
taking the operators in turn so that every kind is represented.

**Possibly equivalent.** A mutant the tests do not kill may still be right (``x < 1`` vs
``x <= 0`` on ints). :func:`call_arguments` reads the literal arguments of the entry point's
calls in the tests, :func:`varied_arguments` varies them (numbers +-1, 0, negated, doubled;
strings emptied, reversed, extended, upper-cased, a number in one +-1; lists emptied, reversed, shortened,
extended, sorted; ...), and :func:`equivalence_tests` makes tests that call the mutant and the
reference (from the setup, renamed) on each and compare results, exceptions and the arguments
after the call. A survivor that agrees on all of them is reported as *possibly equivalent*
(left out of the score); one that disagrees shows the input that tells them apart.
"""

from __future__ import annotations

import ast
import copy
import itertools

import msgspec

OPERATORS = ("arith", "compare", "boolean", "constant", "return", "statement")
REFERENCE_PREFIX = "_intake_reference_"
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult,
          ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.LShift: ast.RShift, ast.RShift: ast.LShift,
          ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.BitXor: ast.BitOr}
_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
            ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%", ast.Pow: "**",
           ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.Lt: "<",
           ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
           ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.And: "and", ast.Or: "or"}
_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.If, ast.For, ast.While, ast.Raise,
              ast.Delete, ast.With, ast.Try, ast.Assert)
MAX_VARIED = 24  # inputs per equivalence check


class Mutant(msgspec.Struct, frozen=True, kw_only=True):
    operator: str  # one of OPERATORS
    line: int  # in the reference
    change: str  # what changed, e.g. "< -> <=" or "removed: total += x"
    source: str  # the mutated program


def _skipped(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings, annotations, imports, and everything under them."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            skip.update(id(n) for n in ast.walk(body[0]))
        roots = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots += [a.annotation for a in ast.walk(node.args) if isinstance(a, ast.arg) and a.annotation]
            roots += [node.returns] if node.returns else []
        if isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots.append(node)
        for root in roots:
            skip.update(id(n) for n in ast.walk(root))
    return skip


def _points(tree: ast.AST) -> list[tuple[int, str, int]]:
    """(node index in ast.walk order, operator, variant) of every mutation the tree allows."""
    skip = _skipped(tree)
    points = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITH:
            points.append((index, "arith", 0))
        elif isinstance(node, ast.Compare):
            points += [(index, "compare", i) for i, op in enumerate(node.ops) if type(op) in _COMPARE]
        elif isinstance(node, ast.BoolOp):
            points.append((index, "boolean", 0))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            points.append((index, "boolean", 0))
        elif isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool) or isinstance(value, str):
                points.append((index, "constant", 0))
            elif isinstance(value, int):
                points += [(index, "constant", 0), (index, "constant", 1)]
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            points.append((index, "return", 0))
        if isinstance(node, _REMOVABLE) and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            points.append((index, "statement", 0))
    return points


def _apply(tree: ast.AST, index: int, operator: str, variant: int) -> str | None:
    """Mutate node ``index`` of ``tree`` in place; returns what changed (None: nothing to do)."""
    node = next(itertools.islice(ast.walk(tree), index, None))
    if operator == "arith":
        old = type(node.op)
        node.op = _ARITH[old]()
        return f"{_SYMBOL[old]} -> {_SYMBOL[_ARITH[old]]}"
    if operator == "compare":
        old = type(node.ops[variant])
        node.ops[variant] = _COMPARE[old]()
        return f"{_SYMBOL[old]} -> {_SYMBOL[_COMPARE[old]]}"
    if operator == "boolean" and isinstance(node, ast.BoolOp):
        old = type(node.op)
        node.op = ast.Or() if old is ast.And else ast.And()
        return f"{_SYMBOL[old]} -> {'or' if old is ast.And else 'and'}"
    if operator == "boolean":  # not x -> x, -x -> x
        return f"removed {'not' if isinstance(node.op, ast.Not) else 'unary -'}"
    if operator == "constant":
        value = node.value
        if isinstance(value, bool):
            node.value = not value
        elif isinstance(value, str):
            node.value = "" if value else "x"
        else:
            node.value = value + 1 if variant == 0 else value - 1
        return f"{value!r} -> {node.value!r}"
    if operator == "return":
        node.value = ast.Constant(None)
        return "return None"
    return "removed: " + ast.unparse(node).splitlines()[0][:80]


class _Unwrap(ast.NodeTransformer):
    """Replaces one UnaryOp (by id) by its operand, and one statement (by id) by ``pass``."""

    def __init__(self, target: int, statement: bool) -> None:
        self.target, self.statement = target, statement

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        return node.operand if id(node) == self.target and not self.statement else node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if self.statement and id(node) == self.target:
            return ast.copy_location(ast.Pass(), node)
        return super().generic_visit(node)


def all_mutants(reference: str) -> list[Mutant]:
    """Every distinct mutant of ``reference`` (in the order of the reference's nodes)."""
    try:
        original_tree = ast.parse(reference)
    except (SyntaxError, ValueError, RecursionError):
        return []
    original = ast.unparse(original_tree)
    seen = {original}
    out = []
    for index, operator, variant in _points(original_tree):
        tree = copy.deepcopy(original_tree)
        node = next(itertools.islice(ast.walk(tree), index, None))
        line = getattr(node, "lineno", 0)
        change = _apply(tree, index, operator, variant)
        if operator == "statement" or (operator == "boolean" and isinstance(node, ast.UnaryOp)):
            tree = _Unwrap(id(node), operator == "statement").visit(tree)
        try:
            source = ast.unparse(ast.fix_missing_locations(tree))
            compile(source, "<mutant>", "exec")
        except (SyntaxError, ValueError, RecursionError):
            continue
        if source in seen:
            continue
        seen.add(source)
        out.append(Mutant(operator=operator, line=line, change=change or operator, source=source + "\n"))
    return out


def mutants(reference: str, limit: int = 0) -> tuple[list[Mutant], int]:
    """(at most ``limit`` mutants, 0 = all, taken from each operator in turn; how many there were)."""
    every = all_mutants(reference)
    if not limit or len(every) <= limit:
        return every, len(every)
    by_operator = {op: [m for m in every if m.operator == op] for op in OPERATORS}
    chosen: list[Mutant] = []
    for round_ in itertools.count():
        took = False
        for op in OPERATORS:
            members = by_operator[op]
            if round_ < len(members) and len(chosen) < limit:
                # spread over the operator's mutants: first, last, middle, ...
                chosen.append(members[_bisect_order(len(members))[round_]])
                took = True
        if not took or len(chosen) >= limit:
            break
    order = {id(m): i for i, m in enumerate(every)}
    return sorted(chosen, key=lambda m: order[id(m)]), len(every)


def _bisect_order(n: int) -> list[int]:
    order, seen = [], set()
    queue = [(0, n - 1)]
    for i in (0, n - 1):
        if i not in seen:
            seen.add(i)
            order.append(i)
    while queue:
        low, high = queue.pop(0)
        if high - low < 2:
            continue
        mid = (low + high) // 2
        if mid not in seen:
            seen.add(mid)
            order.append(mid)
        queue += [(low, mid), (mid, high)]
    order += [i for i in range(n) if i not in seen]
    return order


# ---- the possible-equivalence check

def call_arguments(tests: list[str], entry_point: str) -> list[tuple[tuple, dict]]:
    """The literal (args, kwargs) of every call of ``entry_point`` in the tests, in order, once each."""
    found: list[tuple[tuple, dict]] = []
    for test in tests:
        try:
            tree = ast.parse(test)
        except (SyntaxError, ValueError, RecursionError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point:
                try:
                    args = tuple(ast.literal_eval(a) for a in node.args)
                    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
                except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                    continue
                if len(kwargs) == len(node.keywords) and (args, kwargs) not in found:
                    found.append((args, kwargs))
    return found


def _variants(value: object) -> list[object]:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, 0, -value, 2 * value + 3]
    if isinstance(value, float):
        return [value + 0.5, -value, 0.0]
    if isinstance(value, str):
        numeric = [str(int(value) + 1), str(int(value) - 1)] if value.strip().lstrip("-").isdigit() else []
        return [*numeric, "", value + value[:1] + "a", value[::-1], value.upper(), value[1:], value + " "]
    if isinstance(value, (list, tuple)):
        kind = type(value)
        items = list(value)
        out = [kind(), kind(items[::-1]), kind(items[1:]), kind(items + items[:1])]
        try:
            out.append(kind(sorted(items)))
        except TypeError:
            pass
        return out
    if isinstance(value, dict):
        return [{}, dict(list(value.items())[1:])]
    if isinstance(value, (set, frozenset)):
        return [type(value)(), type(value)(list(value)[1:])]
    return []


def varied_arguments(calls: list[tuple[tuple, dict]], limit: int = MAX_VARIED) -> list[tuple[tuple, dict]]:
    """The tests' own calls, then each with one argument varied, deterministic, at most ``limit``."""
    out: list[tuple[tuple, dict]] = []

    def add(call: tuple[tuple, dict]) -> None:
        if call not in out and len(out) < limit:
            out.append(call)

    for call in calls:
        add(call)
    rounds = [[(args[:i] + (v,) + args[i + 1:], kwargs) for i, a in enumerate(args) for v in _variants(a)]
              + [(args, {**kwargs, k: v}) for k, a in kwargs.items() for v in _variants(a)]
              for args, kwargs in calls]
    for group in itertools.zip_longest(*rounds):  # the first variant of every call, then the second, ...
        for call in group:
            if call is not None:
                add(call)
    return out


def _call_source(name: str, args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


class _Rename(ast.NodeTransformer):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            node.id = REFERENCE_PREFIX + node.id
        return node

    def _def(self, node: ast.AST) -> ast.AST:
        if node.name in self.names:  # type: ignore[attr-defined]
            node.name = REFERENCE_PREFIX + node.name  # type: ignore[attr-defined]
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def  # type: ignore[assignment]


def renamed_reference(reference: str) -> str:
    """The reference with every name it defines at top level prefixed (so that it can sit in a
    task's setup, in the judge, next to the completion's names)."""
    tree = ast.parse(reference)
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return ast.unparse(_Rename(names).visit(tree)) + "\n"


def equivalence_tests(entry_point: str, inputs: list[tuple[tuple, dict]]) -> list[str]:
    """One test per input: the mutant (the completion) and the renamed reference (in the setup)
    give the same result or raise the same exception, and leave the arguments alike."""
    tests = []
    reference = REFERENCE_PREFIX + entry_point
    for args, kwargs in inputs:
        arguments = repr(args) if len(args) != 1 else f"({args[0]!r},)"
        keywords = repr(kwargs)
        tests.append(
            f"__wa, __wk = {arguments}, {keywords}\n"
            f"try:\n    __want = ('value', {reference}(*__wa, **__wk))\n"
            f"except Exception as __e:\n    __want = ('raises', type(__e).__name__)\n"
            f"__ga, __gk = {arguments}, {keywords}\n"
            f"try:\n    __got = ('value', {entry_point}(*__ga, **__gk))\n"
            f"except Exception as __e:\n    __got = ('raises', type(__e).__name__)\n"
            f"assert (__got, __ga, __gk) == (__want, __wa, __wk)\n"
        )
    return tests


def described_input(entry_point: str, call: tuple[tuple, dict]) -> str:
    return _call_source(entry_point, *call)
