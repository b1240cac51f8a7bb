"""The judge's reading of code and objects from data (consumers/executor/runtime/fromdata.py), on
the host: constant expressions evaluated without code, pickles and marshal data loaded as plain
data only, and the audit hook's rule for what may run."""

from __future__ import annotations

import marshal
import pickle
import sys
import types

import pytest

from rollstream.consumers.executor.runtime.fromdata import (
    ExecGuard,
    NotPlain,
    plain_eval,
    plain_unmarshal,
    plain_unpickle,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("source, value", [
    ("12*34", 408), ("1 + 2 * 3 - -4", 11), ("[1, 'a', (2, 3)]", [1, "a", (2, 3)]), ("{'k': None, 2: {3}}", {"k": None, 2: {3}}),
    ("3 > 2 > 1", True), ("1 if 0 else 2", 2), ("'abc'[1:]", "bc"), ("not (1 and 0)", True), ("  7  ", 7),
    ("2 ** 10 % 1000", 24), (b"b'x' * 3", b"xxx"), ("max(3, 4) - abs(-2)", 2), ("math.sqrt(16)", 4.0),
    ("set([1, 2])", {1, 2}), ("'a'.upper()", "A"), ("sorted(map(str, [3, 1]))", ["1", "3"]),
    ("functools.reduce(operator.add, [1, 2, 3])", 6), ("fractions.Fraction(1, 3)", __import__("fractions").Fraction(1, 3)),
])
def test_constant_expressions_are_evaluated_without_code(source, value) -> None:
    assert plain_eval(source, "eval") == (True, value)


@pytest.mark.parametrize("source", [
    "__import__('os')", "x", "f(1)", "[i for i in range(3)]", "(1).__class__", "lambda: 1", "getattr(1, 'real')",
    "{**{}}", "[*[]]", "1 +", 5, "operator.attrgetter('__class__')(1)", "string.Formatter()", "math.__dict__",
    "decimal.setcontext(decimal.Context())", "open('x')", "type(1)", "vars()",
])
def test_anything_else_is_left_to_the_candidate(source) -> None:
    assert plain_eval(source, "eval") == (False, None)


def test_assignments_of_constants_are_made_without_code() -> None:
    assert plain_eval("x = 5\ny = z = [1, 2]\npass", "exec") == (True, {"x": 5, "y": [1, 2], "z": [1, 2]})
    assert plain_eval("x = y", "exec") == (False, None)
    assert plain_eval("import os", "exec") == (False, None)
    assert plain_eval("x.y = 1", "exec") == (False, None)
    with pytest.raises(ZeroDivisionError):  # the operation's own error, as eval would raise it
        plain_eval("1 / 0", "eval")


class Kept:  # a class of "the tests" below
    def __init__(self, v=0):
        self.v = v


class Payload:
    def __reduce__(self):
        return (exec, ("raise SystemExit",))


def test_pickles_load_as_plain_data_only() -> None:
    tests = types.ModuleType("tests_namespace")
    tests.Kept = Kept
    Kept.__module__ = "tests_namespace"
    sys.modules["tests_namespace"] = tests
    try:
        import collections
        import datetime
        import decimal

        data = {"a": [1, 2.5, "x", b"y", (None, True)], "s": {1, 2}, "d": collections.OrderedDict(a=1),
                "t": datetime.date(2020, 1, 2), "m": decimal.Decimal("1.5"), "k": Kept(3)}
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            loaded = plain_unpickle(pickle.dumps(data, protocol), tests, pickle.Unpickler, {})
            assert {k: v for k, v in loaded.items() if k != "k"} == {k: v for k, v in data.items() if k != "k"}
            assert type(loaded["k"]) is Kept and loaded["k"].v == 3
        with pytest.raises(NotPlain, match="builtins.exec"):
            plain_unpickle(pickle.dumps(Payload()), tests, pickle.Unpickler, {})
        with pytest.raises(pickle.UnpicklingError):
            plain_unpickle(b"not a pickle", tests, pickle.Unpickler, {})
    finally:
        del sys.modules["tests_namespace"]
        Kept.__module__ = __name__


def test_marshal_data_holds_no_code() -> None:
    assert plain_unmarshal(marshal.dumps({"k": [1, (2, 3)]}), marshal.loads) == {"k": [1, (2, 3)]}
    with pytest.raises(ValueError, match="code"):
        plain_unmarshal(marshal.dumps([compile("1", "<x>", "eval")]), marshal.loads)


class _Guards:
    def __init__(self, own=(), trusted=()):
        self.own, self.texts = {id(c) for c in own}, {id(t) for t in trusted}

    def own_code(self, code):
        return id(code) in self.own

    def trusted(self, text):
        return id(text) in self.texts


def test_the_exec_hook_runs_only_the_tests_own_code() -> None:
    own = compile("x = 1", "<test 0>", "exec")
    guard = ExecGuard(lambda: _Guards(own=[own]), (), lambda path: path.startswith("/usr/lib/python3"))
    frame = sys._getframe()
    assert guard.may_run(_Guards(own=[own]), own, frame)
    assert not guard.may_run(_Guards(own=[own]), compile("x = 2", "<doctest>", "exec"), frame)
    import collections

    point = collections.namedtuple("Point", "x y")(1, 2)  # the template generator still works
    assert point.y == 2
