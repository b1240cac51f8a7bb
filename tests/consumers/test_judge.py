"""The judge/candidate protocol on the host (consumers/plain.py, candidate.py and judge.py are
stdlib-only and run the same here): the plain-data codec, and whole jobs with a forked candidate
over pipes. The attacks against the real sandbox are in test_tamper.py."""

from __future__ import annotations

import json
import os
from collections import Counter, OrderedDict, namedtuple
from enum import IntEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollstream.consumers import candidate, judge, plain, sandbox

pytestmark = pytest.mark.unit

# ---------------------------------------------------------------- the codec

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
hashables = st.recursive(scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=8)
plain_data = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
        | st.binary().map(bytearray)
    ),
    max_leaves=20,
)


def exact(a: object, b: object) -> bool:
    """Equal with the same types all the way down (== alone says 1 == 1.0 == True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(exact(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(exact(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(plain_data)
def test_plain_data_round_trips_with_exact_types(value: object) -> None:
    assert exact(plain.decode(plain.Encoder().text(value)), value)


def test_floats_keep_their_meaning() -> None:
    for value in (2.0, -0.0, 1e300, float("inf"), float("-inf")):
        assert exact(plain.decode(plain.Encoder().text(value)), value)
    nan = plain.decode(plain.Encoder().text(float("nan")))
    assert type(nan) is float and nan != nan
    assert plain.decode(plain.Encoder().text(2.0)) == 2  # honest results keep their Python meaning


@pytest.mark.parametrize(
    "value, reason",
    [
        (map(str, [1]), "map is not plain data"),
        ((x for x in [1]), "generator is not plain data"),
        (object(), "object is not plain data"),
        (10 ** 5000, "integer too large"),
        ("x" * (plain.MAX_VALUE_BYTES + 1), "too large"),
        (list(range(plain.MAX_VALUE_BYTES)), "too large"),
        (complex(1, 2), "complex is not plain data"),
    ],
    ids=["map", "generator", "object", "huge-int", "huge-str", "huge-list", "complex"],
)
def test_what_is_not_plain_data_is_refused(value: object, reason: str) -> None:
    with pytest.raises(plain.NotPlain, match=reason):
        plain.Encoder().text(value)


def test_cyclic_and_deep_values_are_refused() -> None:
    cycle: list = []
    cycle.append(cycle)
    deep: list = []
    for _ in range(plain.MAX_DEPTH + 5):
        deep = [deep]
    for value in (cycle, deep):
        with pytest.raises(plain.NotPlain, match="deeper than"):
            plain.Encoder().text(value)


def test_the_candidate_side_turns_subclasses_into_their_plain_base() -> None:
    class Level(IntEnum):
        HIGH = 3

    class Sneaky(str):
        def __eq__(self, other: object) -> bool:  # what an attacker's str would say
            return True

        __hash__ = str.__hash__

    point = namedtuple("point", "x y")
    encoder = plain.Encoder(handle=lambda obj: None)
    for value, expected in [
        (Level.HIGH, 3), (Counter("aab"), {"a": 2, "b": 1}), (OrderedDict(a=1), {"a": 1}),
        (point(1, 2), (1, 2)), (Sneaky("no"), "no"),
    ]:
        decoded = plain.decode(encoder.text(value))
        assert exact(decoded, expected), (value, decoded)
    assert plain.decode(encoder.text(Sneaky("no"))) != "yes"


@pytest.mark.parametrize(
    "text",
    [
        '{"t": [1], "s": [2]}',  # two tags
        '{"zz": [1]}',  # unknown tag
        '{"d": [[[1], 2]]}',  # an unhashable dict key
        '{"s": [[1]]}',  # an unhashable set element
        '{"d": [[1, 2, 3]]}',  # not a pair
        '{"b": "zz"}',  # not hex
        '{"h": 1}',  # a handle where none are accepted
        "[1, 2",  # torn
        "[" * 100000 + "]" * 100000,  # deeper than the decoder goes
        "1" * 5000,  # an integer over Python's digit limit
    ],
    ids=["two-tags", "unknown-tag", "unhashable-key", "unhashable-element", "not-a-pair", "not-hex",
         "unexpected-handle", "torn", "deep", "huge-int"],
)
def test_the_strict_decoder_refuses_what_the_encoder_never_writes(text: str) -> None:
    with pytest.raises(plain.ProtocolError):
        plain.decode(text)


def test_an_oversized_frame_is_refused_before_it_is_read() -> None:
    r, w = os.pipe()
    try:
        os.write(w, (plain.MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(plain.ProtocolError, match="bytes"):
            plain.receive(r)
    finally:
        os.close(r)
        os.close(w)


def test_tested_names() -> None:
    tests = ("assert f(1) == g(2)", "s = Stack()\nassert len(s) == 0", "with raises(ValueError):\n    h()")
    assert sandbox.tested_names(tests, "f") == ("Stack", "f", "g", "h", "s")
    assert sandbox.tested_names(("assert 1 +",), "f") == ("f",)  # a broken test is the judge's to report
    assert "len" in sandbox.tested_names(("assert len(1)",), "len")  # the entry point always


# ---------------------------------------------------------------- whole jobs over pipes


def judged(code: str, tests: list[str], *, setup: str = "", entry_point: str = "", program: bool = False) -> list[dict]:
    """The judge's events for ``code`` against ``tests``, the candidate a forked process."""
    names = list(sandbox.tested_names(tuple(tests), entry_point))
    setup_code = compile(setup, "<setup>", "exec") if setup else None
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the candidate, with its pipes on descriptors 3 and 4 as in the sandbox
        status = 70
        try:
            high_r, high_w = os.dup(req_r) + 200, os.dup(resp_w) + 200
            os.dup2(req_r, high_r)
            os.dup2(resp_w, high_w)
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            status = candidate.candidate_main(code, setup_code, names, program, 3, 4, 1 << 16)
        finally:
            os._exit(status)
    os.close(req_r)
    os.close(resp_w)
    events: list[dict] = []
    try:
        compiled = [compile(t, f"<test {i}>", "exec") for i, t in enumerate(tests)]
        link = judge.PipeLink(req_w, resp_r)
        judge.judge_main(setup_code, compiled, names, entry_point, judge.Channel(link), events.append)
    finally:
        os.close(req_w)
        os.close(resp_r)
        os.waitpid(pid, 0)
    return events


def verdicts(events: list[dict]) -> list[bool]:
    return [e["ok"] for e in events if e["e"] == "test"]


def test_functions_are_called_with_plain_data() -> None:
    code = "def add(a, b):\n    return a + b\n"
    tests = ["assert add(1, 2) == 3", "assert add('a', 'b') == 'ab'", "assert add(1, 1) == 3",
             "assert add((1,), (2,)) == (1, 2)", "assert add(0.5, 1.5) == 2"]
    events = judged(code, tests, entry_point="add")
    assert verdicts(events) == [True, True, False, True, True]
    assert events[0] == {"e": "compiled"} and events[1] == {"e": "code_ok"} and events[-1] == {"e": "done"}


def test_an_always_equal_object_is_never_equal_to_plain_data() -> None:
    code = (
        "class Yes:\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    def __lt__(self, other): return True\n"
        "    def __gt__(self, other): return True\n"
        "    __hash__ = object.__hash__\n"
        "def f(x):\n    return Yes()\n"
    )
    tests = ["assert f(1) == 2", "assert 2 == f(1)", "assert f(1) in [2]", "assert f(1) < 3 and f(1) > 3",
             "assert f(1) == f(2)"]
    assert verdicts(judged(code, tests, entry_point="f")) == [False, False, False, False, True]  # the last: its own objects


def test_classes_through_handles() -> None:
    code = (
        "class Stack:\n"
        "    def __init__(self): self.items = []\n"
        "    def push(self, x): self.items.append(x)\n"
        "    def pop(self): return self.items.pop()\n"
        "    def __len__(self): return len(self.items)\n"
        "    def __iter__(self): return iter(self.items)\n"
        "    def __contains__(self, x): return x in self.items\n"
        "    def __getitem__(self, i): return self.items[i]\n"
        "    def __str__(self): return 'Stack' + str(self.items)\n"
    )
    tests = [
        "s = Stack()\ns.push(1)\ns.push([2])\nassert len(s) == 2 and s.pop() == [2] and s.items == [1]",
        "s = Stack()\ns.push('a')\nassert list(s) == ['a'] and 'a' in s and s[0] == 'a' and str(s) == \"Stack['a']\"",
        "s = Stack()\nassert s.pop() == 1",  # IndexError from the candidate
        "s = Stack()\nwith raises(IndexError):\n    s.pop()",
        "t = Stack()\nt.count = 3\nassert t.count == 3",
    ]
    assert verdicts(judged(code, tests, entry_point="Stack")) == [True, True, False, True, True]


def test_in_place_mutation_reaches_the_tests_arguments() -> None:
    code = "def sort_it(a, key=None):\n    a.sort()\n    if key is not None:\n        key['done'] = True\n"
    tests = ["x = [3, 1, 2]\nsort_it(x)\nassert x == [1, 2, 3]",
             "x, d = [2, 1], {}\nsort_it(x, key=d)\nassert d == {'done': True}",
             "x = (2, 1)\nsort_it(list(x))\nassert x == (2, 1)"]
    assert verdicts(judged(code, tests, entry_point="sort_it")) == [True, True, True]


def test_exceptions_printed_output_and_helpers() -> None:
    code = (
        "def helper(x):\n    return x * 2\n"
        "def f(x):\n"
        "    if x < 0:\n        raise ValueError('negative')\n"
        "    print('f of', x)\n"
        "    return helper(x)\n"
    )
    tests = [
        "with raises(ValueError, match='neg'):\n    f(-1)",
        "try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'",
        "import contextlib, io\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n    f(2)\n"
        "assert out.getvalue() == 'f of 2\\n'",
        "assert helper(3) == 6",  # a helper the completion defines, called by the tests
        "with raises(ValueError):\n    f(1)",  # did not raise
    ]
    assert verdicts(judged(code, tests, entry_point="f")) == [True, True, True, True, False]


def test_the_tasks_own_helpers_stay_the_judges() -> None:
    """HumanEval-style: the prompt defines a helper the check calls; a completion that redefines
    it must not change what the check believes."""
    setup = "def encode(s):\n    return s[::-1]\ndef decode(s):\n    '''the stub to complete'''\n"
    code = "def encode(s):\n    return s\ndef decode(s):\n    return s\n"  # redefines the helper
    tests = ["def check(candidate):\n    assert candidate(encode('abc')) == 'abc'\ncheck(decode)"]
    assert verdicts(judged(code, tests, setup=setup, entry_point="decode")) == [False]
    honest = "def decode(s):\n    return s[::-1]\n"
    assert verdicts(judged(honest, tests, setup=setup, entry_point="decode")) == [True]
    # the setup's stub is never the answer
    assert verdicts(judged("x = 1\n", tests, setup=setup, entry_point="decode")) == [False]


def test_modules_the_completion_imported_are_the_judges_own_copies() -> None:
    code = "import math, json as math_json\nimport os.path\n"
    tests = ["assert math.sqrt(4) == 2", "assert os.path.join('a', 'b') == 'a/b'", "assert math_json"]
    # math and os: the judge imports its own; math_json is no module of that name: unbound
    assert verdicts(judged(code, tests)) == [True, True, False]


def test_programs_read_stdin_and_are_judged_on_stdout() -> None:
    code = "import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n"
    tests = ["assert run_program('1 2 3\\n') == '6\\n'", "assert run_program('') == '0\\n'",
             "assert run_program(b'4') == '4\\n'", "assert run_program('1') == '2\\n'"]
    assert verdicts(judged(code, tests, program=True)) == [True, True, True, False]


def test_results_that_are_not_plain_data_fail_the_call_and_the_test() -> None:
    code = "def f(x):\n    return map(str, [x])\ndef g(x):\n    a = []\n    a.append(a)\n    return a\n"
    tests = ["assert list(f(1)) == ['1']",
             "try:\n    f(1)\nexcept BaseException:\n    pass",  # catching the failure does not help
             "g(1)"]
    events = judged(code, tests, entry_point="f")
    assert verdicts(events) == [False, False, False]
    assert all(e.get("type") == "FailedCall" for e in events if e["e"] == "test")
    assert not any(e["e"] == "tamper" for e in events)  # an honest failure, not an attack


def test_a_candidate_that_leaves_fails_every_test_it_did_not_answer() -> None:
    code = "import os\ncalls = []\ndef f(x):\n    calls.append(x)\n    if x == 2:\n        os._exit(0)\n    return x\n"
    tests = ["assert f(1) == 1", "try:\n    f(2)\nexcept BaseException:\n    pass", "assert f(3) == 3"]
    events = judged(code, tests, entry_point="f")
    assert verdicts(events) == [True, False, False]
    gone = [e for e in events if e["e"] == "gone"]
    assert len(gone) == 1 and gone[0]["i"] == 1


def test_messages_the_honest_candidate_never_sends_are_tamper() -> None:
    # the completion writes a "reply" of its own to the judge's pipe before it is asked
    forged = json.dumps([1, "ok", True, "", []]).encode()
    code = (
        "import os\n"
        f"frame = {plain.frame(forged)!r}\n"
        "os.write(4, frame + frame)\n"
        "def f(x):\n    return None\n"
    )
    events = judged(code, ["assert f(1) is True", "assert f(2) is True"], entry_point="f")
    assert verdicts(events) == [False, False]
    assert [e["kind"] for e in events if e["e"] == "tamper"] == ["protocol"]
