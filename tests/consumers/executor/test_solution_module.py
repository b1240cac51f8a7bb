"""Tests that import the completion as a module (issue 40 item 2): ``from solution import add``,
``import solution`` and ``import solution as s`` bind the completion's names in every test form,
under the judge's rules (a reference's bindings, plain data where it gives plain data), and
nothing the completion does to its own ``sys.modules`` reaches the tests."""

from __future__ import annotations

import uuid

import pytest

from rollstream.consumers.executor import jobs
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec

ADD = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def __init__(self):\n        self.items = []\n" \
      "    def push(self, x):\n        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
FORMS = [
    "from solution import add\nassert add(1, 2) == 3",
    "from solution import add as plus, Stack\ns = Stack()\ns.push(plus(2, 2))\nassert s.pop() == 4",
    "import solution\nassert solution.add(2, 3) == 5",
    "import solution as sol\nassert sol.add('a', 'b') == 'ab'",
    "def test_add():\n    from solution import add\n    assert add(-1, 1) == 0\ntest_add()",
    "import unittest\nfrom solution import add\nclass T(unittest.TestCase):\n    def test_add(self):\n"
    "        self.assertEqual(add(2, 2), 4)\nunittest.main(exit=False)",
]


async def score(pool, registry, code, tests, **spec):
    evaluation = await evaluate(pool, registry, RewardSpec(tests=tests, timeout_s=10.0, **spec),
                                f"```python\n{code}```", f"solution/{uuid.uuid4().hex[:6]}")
    return evaluation.scored


@pytest.mark.unit
def test_the_names_taken_from_the_module_are_asked_of_the_completion() -> None:
    assert set(jobs.tested_names((FORMS[1],), "add")) == {"add", "Stack"}  # not the alias plus
    assert set(jobs.tested_names((FORMS[3],), "add")) == {"add"}
    assert jobs.tested_names(("import solutions\nassert solutions.x == 1",), "") == ()  # another module
    # what the tests patch on the module is a name they read from it
    patched = ("from unittest import mock\nwith mock.patch('solution.helper', return_value=2):\n    assert f() == 2",
               "import solution\ndef test(monkeypatch):\n    monkeypatch.setattr(solution, 'clock', lambda: 0)",
               "import solution as s\nfrom unittest import mock\nmock.patch.object(s, 'rate')")
    assert {"f", "helper", "clock", "rate"} <= set(jobs.tested_names(patched, "f"))
    assert jobs.tested_names(("x = 'solutions.y'\nassert f(x)",), "f") == ("f",)


@pytest.mark.sandbox
@pytest.mark.parametrize("trust", ["judge", "in_process"])
async def test_every_form_of_importing_the_completion_passes(pool, registry, trust: str) -> None:
    scored = await score(pool, registry, ADD, FORMS, entry_point="add", trust=trust)
    assert scored.reward == 1.0, scored.execution.test_results


@pytest.mark.sandbox
async def test_with_a_reference_the_module_s_names_are_bound_as_the_reference_binds_them(pool, registry) -> None:
    scored = await score(pool, registry, ADD, FORMS, entry_point="add", reference=ADD)
    assert scored.reward == 1.0, scored.execution.test_results
    # a completion object where the reference gives plain data still fails its test
    cheat = ("class Yes:\n    def __eq__(self, other):\n        return True\n"
             "def add(a, b):\n    return Yes()\n")
    scored = await score(pool, registry, cheat, FORMS[:1] + FORMS[2:4], entry_point="add", reference=ADD)
    assert scored.reward == 0.0 and scored.execution.tests_passed == 0, scored.execution.test_results


@pytest.mark.sandbox
async def test_a_name_the_completion_does_not_define_is_an_import_error(pool, registry) -> None:
    scored = await score(pool, registry, ADD, ["from solution import sub\nassert sub(3, 1) == 2",
                                               "import solution\nassert solution.mul(2, 2) == 4"])
    results = scored.execution.test_results
    assert [r.outcome for r in results] == ["error", "error"], results
    assert results[0].error_type == "ImportError" and results[1].error_type == "AttributeError", results
    assert scored.reward == 0.0


@pytest.mark.sandbox
async def test_the_completion_s_own_sys_modules_does_not_reach_the_tests(pool, registry) -> None:
    # a wrong add, and a module of its making put where it would import as "solution"
    code = ("import sys, types\ndef add(a, b):\n    return a - b\n"
            "fake = types.ModuleType('solution')\nfake.add = lambda a, b: a + b\nsys.modules['solution'] = fake\n"
            "sys.modules['__main__'] = fake\n")
    scored = await score(pool, registry, code, FORMS[:1] + FORMS[2:4], entry_point="add")
    assert scored.reward == 0.0 and scored.execution.tests_passed == 0, scored.execution.test_results


@pytest.mark.sandbox
async def test_a_name_the_tests_only_patch_on_the_module_is_the_completion_s(pool, registry) -> None:
    """``mock.patch("solution.helper", ...)`` or ``mock.patch.object(solution, "helper", ...)`` with
    ``helper`` read nowhere else in the tests: the patch reaches the completion's function (no
    AttributeError on a name the judge's module was never asked for); a wrong ``f`` still fails."""
    code = "def helper():\n    return 1\n\ndef f():\n    return helper() + 1\n"
    tests = ["from unittest import mock\nwith mock.patch('solution.helper', lambda: 10):\n    assert f() == 11",
             "import solution\nfrom unittest import mock\nwith mock.patch.object(solution, 'helper', lambda: 5):\n"
             "    assert f() == 6\nassert f() == 2"]
    scored = await score(pool, registry, code, tests, entry_point="f")
    assert scored.reward == 1.0, scored.execution.test_results
    wrong = await score(pool, registry, "def helper():\n    return 1\n\ndef f():\n    return 2\n", tests, entry_point="f")
    assert wrong.execution.tests_passed == 0, wrong.execution.test_results
