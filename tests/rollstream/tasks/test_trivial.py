"""Trivial programs (rollstream/tasks/trivial.py): which ones a task's tests meet, and the verdict
decided without a sandbox where the tests are plain comparisons of literals."""

from __future__ import annotations

import pytest

from rollstream.tasks.trivial import decide, trivial_programs

pytestmark = pytest.mark.unit


def names(programs):
    return [p.name for p in programs]


def passing(entry: str, tests: list[str], reference: str = "") -> list[str]:
    return [p.name for p in trivial_programs(entry, tests, reference) if decide(p, tests, entry)]


def test_the_programs_return_each_argument_each_constant_and_the_empty_values():
    programs = trivial_programs("pick", ["assert pick(1, [2, 3]) == [3]", "assert pick(0, []) is None"],
                                "def pick(a, b, c=None):\n    return b[a:] or None\n")
    found = names(programs)
    assert found[:3] == ["return argument 0 (the identity)", "return argument 1", "return argument 2"]
    assert "return [3]" in found and "return None" in found and "return []" in found and "return 1" in found
    assert found.index("return [3]") < found.index("return 1")  # the expected values first
    assert len(found) == len(set(found))
    assert trivial_programs("", ["assert x == 1"]) == []  # not a function task
    source = next(p.source for p in programs if p.name == "return argument 1")
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 (our own one-line program)
    assert namespace["pick"](5, 6) == 6


def test_tests_a_trivial_program_passes_are_found_without_running_it():
    # the planted tasks of the issue: "return the last argument", "return a constant of the tests"
    assert passing("larger", ["assert larger(1, 2) == 2", "assert larger(3, 5) == 5"]) == ["return argument 1"]
    assert passing("vowels", ["assert vowels('hello') == 2", "assert vowels('moon') == 2"]) == ["return 2"]
    assert passing("empty", ["assert empty([]) == []", "assert not empty([0])"]) == ["return []"]
    # tests that tell them apart
    assert passing("larger", ["assert larger(1, 2) == 2", "assert larger(5, 3) == 5", "assert larger(4, 4) == 4"]) == []
    assert passing("is_adult", ["assert is_adult(19)", "assert not is_adult(5)"]) == []
    assert passing("none", ["assert none(3) is None", "assert none(4) is None"]) == ["return None"]


def test_what_is_not_a_plain_comparison_is_left_to_the_sandbox():
    program = trivial_programs("f", ["assert f(1) == 1"])[0]
    for tests in (["assert sorted(f([2, 1])) == [1, 2]"], ["x = f(1)\nassert x == 1"], ["assert f(y) == 1"],
                  ["assert f(1) < 2"], ["assert f(1) is 1"], ["assert f(*[1]) == 1"], ["import x"]):
        assert decide(program, tests, "f") is None, tests
    # one test failing decides it even when another is not plain
    assert decide(program, ["assert f(1) == 2", "assert sorted(f([1])) == [1]"], "f") is False
    # an argument the call does not have: the sandbox says (it raises there)
    second = trivial_programs("f", ["assert f(1, 2) == 1"])[1]
    assert decide(second, ["assert f(1) == 1"], "f") is None
