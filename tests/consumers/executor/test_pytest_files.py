"""pytest files under the judge (issue 40 item 2): a task's tests given as pytest files
(``kind = "python_pytest"``) run through the real sandbox with the image's pytest: test functions
and classes, parametrize, fixtures, ``raises``/``warns``/``approx``, ``tmp_path``,
``capsys``/``capfd``, ``monkeypatch`` and ``caplog`` keep their meaning for honest code, each
collected test is one test of the verdict named by its node id, and the completion can neither
skip, xfail or stop a test nor get anything it writes collected."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec

pytestmark = [pytest.mark.sandbox, pytest.mark.containment]  # containment: again under runsc in CI

SOLUTION = '''\
import logging, os, warnings

def add(a, b):
    return a + b

def mean(xs):
    if not xs:
        raise ValueError("empty")
    return sum(xs) / len(xs)

def shout(name):
    print(f"HELLO {name.upper()}")

def read_first_line(path):
    with open(path) as f:
        return f.readline().rstrip("\\n")

def greeting():
    return f"hi {os.environ.get('USER_NAME', 'nobody')}"

def ask():
    return input("name? ").strip().title()

def cwd_files():
    return sorted(os.listdir("."))

def old_api():
    warnings.warn("use new_api", DeprecationWarning)
    return 1

def noisy():
    logging.getLogger("solution").warning("careful")
    return 2

class Counter:
    def __init__(self):
        self.n = 0
    def inc(self):
        self.n += 1
        return self.n
'''

HONEST = '''\
import pytest
from solution import add, mean, shout, read_first_line, greeting, ask, cwd_files, old_api, noisy, Counter
import solution


@pytest.fixture
def counter():
    return Counter()


@pytest.mark.parametrize("a, b, expected", [(1, 2, 3), (-1, 1, 0), ("a", "b", "ab")])
def test_add(a, b, expected):
    assert add(a, b) == expected


def test_mean_and_approx():
    assert mean([0.1, 0.2]) == pytest.approx(0.15)
    with pytest.raises(ValueError, match="empty"):
        mean([])


def test_fixture(counter):
    counter.inc()
    assert counter.inc() == 2


def test_printed(capsys):
    shout("bob")
    assert capsys.readouterr().out == "HELLO BOB\\n"


def test_printed_fd(capfd):
    shout("amy")
    assert "HELLO AMY" in capfd.readouterr().out


def test_files(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("first\\nsecond\\n")
    assert read_first_line(str(path)) == "first"


def test_environment(monkeypatch):
    monkeypatch.setenv("USER_NAME", "zoe")
    assert greeting() == "hi zoe"


def test_input(monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt="": "  ada lovelace ")
    assert ask() == "Ada Lovelace"


def test_chdir(monkeypatch, tmp_path):
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "a.txt").write_text("")
    monkeypatch.chdir(tmp_path)
    assert cwd_files() == ["a.txt", "b.txt"]


def test_warns():
    with pytest.warns(DeprecationWarning):
        assert old_api() == 1


def test_logs(caplog):
    assert noisy() == 2
    assert "careful" in caplog.text


def test_module_attribute():
    assert solution.add(2, 2) == 4


class TestCounter:
    def test_starts_at_zero(self, counter):
        assert counter.n == 0

    def test_counts(self):
        c = Counter()
        assert [c.inc(), c.inc()] == [1, 2]


@pytest.mark.skip(reason="the tests' own skip")
def test_skipped():
    assert False


@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert add(1, 1) == 3
'''
HONEST_TESTS = 18  # collected by HONEST (add: 3 parameter sets)


async def score(pool, registry, code, files, **spec):
    """The completion's verdict; a spec with a reference is checked against it (its record goes with the job)."""
    references = ReferenceChecks(pool) if spec.get("reference") else None
    evaluation = await evaluate(pool, registry, RewardSpec(kind="python_pytest", tests=files, timeout_s=20.0, **spec),
                                f"```python\n{code}```", f"pytest/{uuid.uuid4().hex[:6]}", references=references)
    if references is not None:
        assert evaluation.reference is not None and evaluation.reference.judged, evaluation.reference
    return evaluation.scored


@pytest.mark.parametrize("trust", ["judge", "in_process"])
async def test_an_honest_pytest_file_scores_full(pool, registry, trust: str) -> None:
    scored = await score(pool, registry, SOLUTION, [HONEST], entry_point="add", trust=trust)
    e = scored.execution
    assert e.tests_total == HONEST_TESTS, e.test_results
    assert scored.reward == 1.0, [r for r in e.test_results if r.outcome != "passed"]
    outcomes = {r.node_id: r.outcome for r in e.test_results}
    assert outcomes["test_solution.py::test_add[a-b-ab]"] == "passed"
    assert outcomes["test_solution.py::TestCounter::test_counts"] == "passed"
    assert outcomes["test_solution.py::test_skipped"] == "skipped"
    assert outcomes["test_solution.py::test_expected_failure"] == "skipped"  # xfailed: the tests' own
    assert e.tests_skipped == 2 and e.tests_passed == HONEST_TESTS - 2
    skipped = {r.node_id: (r.error_type, r.message) for r in e.test_results if r.outcome == "skipped"}
    assert skipped == {"test_solution.py::test_skipped": ("Skipped", "the tests' own skip"),
                       "test_solution.py::test_expected_failure": ("XFail", "expected to fail: known")}
    assert all(r.duration_s > 0 for r in e.test_results if r.outcome == "passed")


async def test_with_a_reference_too(pool, registry) -> None:
    scored = await score(pool, registry, SOLUTION, [HONEST], entry_point="add", reference=SOLUTION)
    assert scored.reward == 1.0, [r for r in scored.execution.test_results if r.outcome != "passed"]
    cheat = SOLUTION.replace("    return a + b", "    class Yes:\n        def __eq__(self, o):\n            return True\n"
                                               "    return Yes()")
    scored = await score(pool, registry, cheat, [HONEST], entry_point="add", reference=SOLUTION)
    failed = {r.node_id for r in scored.execution.test_results if r.outcome == "failed"}
    assert {f"test_solution.py::test_add[{p}]" for p in ("1-2-3", "-1-1-0", "a-b-ab")} <= failed, failed


async def test_a_failing_test_is_named_by_its_node_id_with_both_sides(pool, registry) -> None:
    wrong = SOLUTION.replace("return a + b", "return a * b")
    scored = await score(pool, registry, wrong, [HONEST], entry_point="add")
    results = {r.node_id: r for r in scored.execution.test_results}
    failed = results["test_solution.py::test_add[1-2-3]"]
    assert failed.outcome == "failed" and failed.error_type == "AssertionError" and failed.message == "2 == 3", failed
    assert results["test_solution.py::test_add[a-b-ab]"].error_type == "TypeError"
    assert 0 < scored.reward < 1


@pytest.mark.parametrize("move", [  # pytest is the judge's: the completion's process cannot even import it
    "import pytest\n    pytest.skip('nothing to see')",
    "import pytest\n    pytest.xfail('expected')",
    "import pytest\n    pytest.exit('stop the run')",
    "import pytest\n    pytest.fail('failed on purpose')",
    "raise KeyboardInterrupt",
    "raise SystemExit(0)",
    "import unittest\n    raise unittest.SkipTest('skip')",
])
async def test_the_completion_cannot_skip_xfail_or_stop_a_test(pool, registry, move: str) -> None:
    code = SOLUTION.replace("def add(a, b):\n    return a + b", f"def add(a, b):\n    {move}")
    scored = await score(pool, registry, code, [HONEST], entry_point="add")
    e = scored.execution
    assert e.tests_total == HONEST_TESTS
    adds = [r for r in e.test_results if r.node_id.startswith("test_solution.py::test_add[")]
    assert [r.outcome for r in adds] == ["error"] * 3, adds
    skipped = {r.node_id for r in e.test_results if r.outcome == "skipped"}
    assert skipped <= {"test_solution.py::test_skipped", "test_solution.py::test_expected_failure"}, skipped
    assert e.tests_passed <= HONEST_TESTS - 2 - 3 and scored.reward < 1.0


async def test_nothing_the_completion_writes_is_collected_or_configures_pytest(pool, registry) -> None:
    planted = (
        "import os\n"
        "for d in ('/work', os.getcwd()):\n"
        "    try:\n"
        "        open(os.path.join(d, 'conftest.py'), 'w').write("
        "'import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
        "    out = yield\\n    out.get_result().outcome = \"passed\"\\n')\n"
        "        open(os.path.join(d, 'pytest.ini'), 'w').write('[pytest]\\naddopts = -p no:python -k nothing\\n')\n"
        "        open(os.path.join(d, 'test_planted.py'), 'w').write('def test_free():\\n    pass\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "def test_own():\n    pass\n"
    )
    wrong = SOLUTION.replace("return a + b", "return None") + planted
    scored = await score(pool, registry, wrong, ["from solution import *\n" + HONEST], entry_point="add")
    e = scored.execution
    nodes = [r.node_id for r in e.test_results]
    assert e.tests_total == HONEST_TESTS and not any("planted" in n or "test_own" in n or "free" in n for n in nodes)
    assert [r.outcome for r in e.test_results if "test_add[" in r.node_id] == ["failed", "failed", "failed"]


async def test_a_file_that_cannot_run_is_one_failed_test(pool, registry) -> None:
    scored = await score(pool, registry, SOLUTION, ["from solution import subtract\n\ndef test_x():\n    assert subtract(2, 1) == 1\n",
                                                  "def helper():\n    return 1\n",
                                                  "def test_ok():\n    from solution import add\n    assert add(1, 1) == 2\n"])
    e = scored.execution
    assert e.tests_total == 3 and e.tests_passed == 1, e.test_results
    first, second, third = e.test_results
    assert first.outcome == "error" and first.error_type == "ImportError" and "did not run" in first.message
    assert second.error_type == "NoTests" and third.outcome == "passed" and third.node_id == "test_solution.py::test_ok"


PYTEST_ZYGOTE_RSS = '''\
import os

def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

def pytest_zygote_rss_kb():
    """The pytest zygote: the one child of PID 1 with no child (mine is my zygote; the judge's its zygote's)."""
    procs = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    parents = {p: _parent(p) for p in procs if p != 1}
    zygotes = [p for p, parent in parents.items() if parent == 1 and p not in parents.values()]
    assert len(zygotes) == 1, parents
    with open(f"/proc/{zygotes[0]}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

print("RSS", pytest_zygote_rss_kb())
'''


async def test_a_container_loads_pytest_only_when_its_first_pytest_file_comes(pool, registry) -> None:
    """The pytest zygote imports pytest when the container's first pytest file comes, not at its
    start: a container that never runs one never holds pytest's pages (some 10 MB a container)."""

    async def rss_kb() -> int:
        evaluation = await evaluate(pool, registry, RewardSpec(tests=["assert True"], timeout_s=20.0),
                                    f"```python\n{PYTEST_ZYGOTE_RSS}```", f"rss/{uuid.uuid4().hex[:6]}")
        assert evaluation.scored.reward == 1.0, evaluation.scored.execution
        return int(evaluation.scored.execution.stdout_tail.split()[1])

    before = await rss_kb()
    await asyncio.sleep(3.0)  # an idle container: time enough for a zygote warming up at start to show it
    idle = await rss_kb()  # still none: a job of statement tests never warms it
    scored = await score(pool, registry, SOLUTION, [HONEST], entry_point="add")
    assert scored.reward == 1.0, [r for r in scored.execution.test_results if r.outcome != "passed"]
    after = await rss_kb()
    assert idle - before < 1024 and after - idle > 4096, (before, idle, after)


# --- issue 52 item 1: unittest cases, monkeypatch, PEP 562 names, the collected count --------------

UNITTEST_FILE = '''\
import unittest
import pytest
from solution import add, mean


class TestAdd(unittest.TestCase):
    def setUp(self):
        self.pairs = [(1, 2, 3), (-1, 1, 0)]

    def test_pairs(self):
        for a, b, expected in self.pairs:
            with self.subTest(a=a, b=b):
                self.assertEqual(add(a, b), expected)

    def test_strings(self):
        self.assertEqual(add("a", "b"), "ab")

    def test_raises(self):
        with self.assertRaises(ValueError):
            mean([])

    @unittest.skip("the tests' own skip")
    def test_skipped(self):
        self.fail("never runs")

    @unittest.expectedFailure
    def test_known_bug(self):
        self.assertEqual(add(1, 1), 3)


class TestMean(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.values = [1, 2, 3]

    def test_mean(self):
        self.assertAlmostEqual(mean(self.values), 2.0)


def test_plain_function_beside_them():
    assert add(2, 2) == 4


def test_the_debugger_stays_unloaded(request):
    assert not request.config.pluginmanager.has_plugin("debugging")
    assert request.config.getoption("usepdb") is False and request.config.getoption("trace") is False
'''
UNITTEST_TESTS = 8


@pytest.mark.parametrize("reference, trust", [(False, "judge"), (True, "judge"), (False, "in_process")])
async def test_unittest_cases_in_a_pytest_file_run_as_pytest_runs_them(pool, registry, reference: bool,
                                                                       trust: str) -> None:
    spec = {"reference": SOLUTION, "trust": trust} if reference else {"trust": trust}
    scored = await score(pool, registry, SOLUTION, [UNITTEST_FILE], entry_point="add", **spec)
    e = scored.execution
    assert e.tests_total == UNITTEST_TESTS, e.test_results
    assert scored.reward == 1.0, [r for r in e.test_results if r.outcome != "passed"]
    outcomes = {r.node_id: r.outcome for r in e.test_results}
    assert outcomes["test_solution.py::TestAdd::test_pairs"] == "passed"
    assert outcomes["test_solution.py::TestMean::test_mean"] == "passed"
    assert outcomes["test_solution.py::TestAdd::test_skipped"] == "skipped"
    assert outcomes["test_solution.py::TestAdd::test_known_bug"] == "skipped"  # xfailed: the tests' own


@pytest.mark.parametrize("wrong", [
    "def add(a, b):\n    return a - b",  # a wrong answer: unittest's failure is the test's failure
    "def add(a, b):\n    class Yes:\n        def __eq__(self, o):\n            return True\n    return Yes()",
    "def add(a, b):\n    import unittest\n    raise unittest.SkipTest('nothing to see')",  # a skip of the completion's
    "def add(a, b):\n    raise KeyboardInterrupt",
])
@pytest.mark.parametrize("reference", [False, True])
async def test_a_unittest_case_fails_what_the_completion_got_wrong(pool, registry, wrong: str, reference: bool) -> None:
    code = SOLUTION.replace("def add(a, b):\n    return a + b", wrong)
    spec = {"reference": SOLUTION} if reference else {}
    scored = await score(pool, registry, code, [UNITTEST_FILE], entry_point="add", **spec)
    e = scored.execution
    assert e.tests_total == UNITTEST_TESTS, e.test_results
    outcomes = {r.node_id: r.outcome for r in e.test_results}
    for node in ("TestAdd::test_pairs", "TestAdd::test_strings", "test_plain_function_beside_them"):
        assert outcomes[f"test_solution.py::{node}"] in ("failed", "error"), e.test_results
    assert scored.reward < 1.0


RANDOM_SOLUTION = '''\
import random
import time

def roll():
    return random.randint(1, 6)

def stamp():
    return time.time()

def can_choose():
    return hasattr(random, "choice")
'''

MONKEYPATCH_FILE = '''\
import random
import time
import pytest
from solution import roll, stamp, can_choose


def test_object_form(monkeypatch):
    monkeypatch.setattr(random, "randint", lambda a, b: 4)
    assert roll() == 4


def test_string_form(monkeypatch):
    monkeypatch.setattr("random.randint", lambda a, b: b)
    assert [roll(), roll()] == [6, 6]


def test_undone_at_teardown():
    assert len({roll() for _ in range(200)}) > 1


def test_delattr(monkeypatch):
    monkeypatch.delattr(random, "choice")
    assert can_choose() is False


def test_delattr_string_form(monkeypatch):
    monkeypatch.delattr("random.choice")
    assert not can_choose()


def test_delattr_undone():
    assert can_choose() is True


def test_setitem_of_a_module_dict(monkeypatch):
    monkeypatch.setitem(vars(time), "time", lambda: 1234.5)
    assert stamp() == 1234.5


def test_context_and_undo():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(random, "randint", lambda a, b: 2)
        assert roll() == 2
    patch = pytest.MonkeyPatch()
    patch.setattr(time, "time", lambda: 7.0)
    assert stamp() == 7.0
    patch.undo()
    assert stamp() > 1e9 and len({roll() for _ in range(200)}) > 1
'''
MONKEYPATCH_TESTS = 8


@pytest.mark.parametrize("reference", [False, True])
async def test_the_tests_monkeypatch_reaches_the_completion_as_mock_patch_does(pool, registry, reference: bool) -> None:
    spec = {"reference": RANDOM_SOLUTION} if reference else {}
    scored = await score(pool, registry, RANDOM_SOLUTION, [MONKEYPATCH_FILE], entry_point="roll", **spec)
    e = scored.execution
    assert e.tests_total == MONKEYPATCH_TESTS and scored.reward == 1.0, [r for r in e.test_results if r.outcome != "passed"]


@pytest.mark.parametrize("wrong, failing", [
    ("def roll():\n    return 4", {"test_string_form", "test_undone_at_teardown", "test_context_and_undo"}),
    # a generator of its own (always 1 from this seed), not the module's function the tests patch
    ("def roll():\n    return random.Random(2).randint(1, 6)", {"test_object_form", "test_string_form",
                                                               "test_undone_at_teardown", "test_context_and_undo"}),
    ("def can_choose():\n    return True", {"test_delattr", "test_delattr_string_form"}),
    ("def stamp():\n    return time.monotonic()", {"test_setitem_of_a_module_dict", "test_context_and_undo"}),
    # the tests' patch is theirs: the completion cannot rewrite it
    ("def roll():\n    random.randint.__code__ = (lambda a, b: 6).__code__\n    return random.randint(1, 6)",
     {"test_object_form"}),
])
async def test_monkeypatch_still_fails_what_the_completion_got_wrong(pool, registry, wrong: str, failing: set) -> None:
    name = wrong.split("(")[0]
    start = RANDOM_SOLUTION.index(name)
    end = RANDOM_SOLUTION.find("\ndef ", start + 1)
    code = RANDOM_SOLUTION[:start] + wrong + "\n" + (RANDOM_SOLUTION[end:] if end != -1 else "")
    scored = await score(pool, registry, code, [MONKEYPATCH_FILE], entry_point="roll", reference=RANDOM_SOLUTION)
    e = scored.execution
    failed = {r.node_id.split("::")[1] for r in e.test_results if r.outcome != "passed"}
    assert failing <= failed, e.test_results
    assert scored.reward < 1.0


GETATTR_SOLUTION = '''\
import math

_AREAS = {"circle": lambda r: math.pi * r * r, "square": lambda s: s * s}

def __getattr__(name):
    if name.endswith("_area") and name[:-5] in _AREAS:
        return _AREAS[name[:-5]]
    raise AttributeError(f"module 'solution' has no attribute {name!r}")
'''

GETATTR_FILE = '''\
import math
import pytest
from solution import circle_area
import solution


def test_imported():
    assert circle_area(1) == pytest.approx(math.pi)


def test_attribute():
    assert solution.square_area(3) == 9
'''


@pytest.mark.parametrize("reference", [False, True])
async def test_a_name_the_module_getattr_serves_imports(pool, registry, reference: bool) -> None:
    spec = {"reference": GETATTR_SOLUTION} if reference else {}
    scored = await score(pool, registry, GETATTR_SOLUTION, [GETATTR_FILE], entry_point="circle_area", **spec)
    e = scored.execution
    assert e.tests_total == 2 and scored.reward == 1.0, e.test_results


@pytest.mark.parametrize("wrong", [
    GETATTR_SOLUTION.replace('name.endswith("_area")', 'name.endswith("_zone")'),  # serves nothing: an ImportError
    GETATTR_SOLUTION.replace("raise AttributeError", "raise SystemExit") .replace('name.endswith("_area")', "False"),
    "def __getattr__(name):\n    class Yes:\n        def __eq__(self, o):\n            return True\n"
    "        def __call__(self, *a):\n            return self\n    return Yes()\n",
    "def __getattr__(name):\n    return lambda *a: 9\n",
])
@pytest.mark.parametrize("reference", [False, True])
async def test_a_module_getattr_gives_nothing_the_tests_do_not_check(pool, registry, wrong: str, reference: bool) -> None:
    spec = {"reference": GETATTR_SOLUTION} if reference else {}
    scored = await score(pool, registry, wrong, [GETATTR_FILE], entry_point="circle_area", **spec)
    assert scored.reward < 1.0, scored.execution.test_results


CASES_SOLUTION = '''\
CASES = [(0, 0), (1, 1), (2, 4), (3, 9), (-4, 16)]

def square(x):
    return x * x
'''

CASES_FILE = '''\
import pytest
from solution import CASES, square


@pytest.mark.parametrize("x, expected", CASES)
def test_square(x, expected):
    assert square(x) == expected
'''


async def test_the_collected_count_is_held_to_the_reference(pool, registry) -> None:
    scored = await score(pool, registry, CASES_SOLUTION, [CASES_FILE], entry_point="square", reference=CASES_SOLUTION)
    assert scored.execution.tests_total == 5 and scored.reward == 1.0, scored.execution.test_results
    # the same tests in another order: the count is what is held
    shuffled = CASES_SOLUTION.replace("[(0, 0), (1, 1), (2, 4), (3, 9), (-4, 16)]", "[(5, 25), (3, 9), (2, 4), (1, 1), (0, 0)]")
    scored = await score(pool, registry, shuffled, [CASES_FILE], entry_point="square", reference=CASES_SOLUTION)
    assert scored.execution.tests_total == 5 and scored.reward == 1.0, scored.execution.test_results


@pytest.mark.parametrize("cases, passed", [
    ("[(1, 1)]", 1),  # fewer: the reference's five count, the four not collected fail
    ("[]", 0),  # none: pytest's empty parameter set skips, where the reference ran it
    ("[(1, 1)] * 5 + [(2, 4)] * 5", 0),  # more: none of them are the reference's tests
])
async def test_a_completion_that_changes_the_collected_count_does_not_score_full(pool, registry, cases: str,
                                                                                 passed: int) -> None:
    code = CASES_SOLUTION.replace("[(0, 0), (1, 1), (2, 4), (3, 9), (-4, 16)]", cases)
    scored = await score(pool, registry, code, [CASES_FILE], entry_point="square", reference=CASES_SOLUTION)
    e = scored.execution
    assert e.tests_total == max(5, len(eval(cases))), e.test_results
    assert e.tests_passed == passed and scored.reward < 1.0, e.test_results
    reasons = [r.message for r in e.test_results if r.error_type == "CollectedCount"]
    assert reasons and all("the task's reference collected 5" in m for m in reasons), e.test_results


async def test_a_file_that_fails_counts_what_the_reference_collected(pool, registry) -> None:
    code = CASES_SOLUTION.replace("CASES = ", "CASE_LIST = ")
    scored = await score(pool, registry, code, [CASES_FILE], entry_point="square", reference=CASES_SOLUTION)
    e = scored.execution
    assert e.tests_total == 5 and e.tests_passed == 0 and e.test_results[0].error_type == "ImportError", e.test_results
