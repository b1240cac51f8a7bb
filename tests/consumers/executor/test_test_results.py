"""Per-test results in every verdict, through the real sandbox (issue 40): which test failed and
why, a failing comparison's two sides computed by the judge from plain data, the asserts'
evaluation unchanged, and nothing of the completion run to write a message."""

from __future__ import annotations

import io
import json
import uuid

import pytest

from rollstream.config import Config
from rollstream.consumers.executor.score import evaluate, score_file
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec

pytestmark = pytest.mark.sandbox

ADD = "def add(a, b):\n    return a + b\n"


async def record(pool, registry, code, tests, **spec):
    evaluation = await evaluate(pool, registry, RewardSpec(tests=tests, timeout_s=10.0, **spec),
                                f"```python\n{code}```", f"results/{uuid.uuid4().hex[:6]}")
    return evaluation.scored


async def test_a_verdict_names_the_failing_test_and_both_sides(pool, registry) -> None:
    scored = await record(pool, registry, ADD, ["assert add(1, 2) == 3", "assert add(2, 2) == 5"], entry_point="add")
    e = scored.execution
    assert scored.reward == 0.5 and e.tests_passed == 1
    assert [(r.index, r.outcome) for r in e.test_results] == [(0, "passed"), (1, "failed")]
    failed = e.test_results[1]
    assert failed.error_type == "AssertionError" and failed.message == "4 == 5", failed
    assert all(r.duration_s >= 0 for r in e.test_results) and e.test_results_omitted == 0


async def test_each_outcome_and_operator(pool, registry) -> None:
    code = ("def f(x):\n    return [x, 'b']\n"
            "def g():\n    return 1 / 0\n")
    tests = ["assert 'a' in f(1)", "assert f(2) is None", "assert g() == 0", "assert len(f(3)) < 2",
             "import unittest\nclass T(unittest.TestCase):\n    @unittest.skip('not today')\n    def test_x(self):\n"
             "        pass\nunittest.main(exit=False)", "assert f(4) == [4, 'b'], 'own message kept'"]
    e = (await record(pool, registry, code, tests)).execution
    got = {r.index: (r.outcome, r.error_type, r.message) for r in e.test_results}
    assert got[0] == ("failed", "AssertionError", "'a' in [1, 'b']")
    assert got[1] == ("failed", "AssertionError", "[2, 'b'] is None")
    assert got[2][:2] == ("error", "ZeroDivisionError")
    assert got[3] == ("failed", "AssertionError", "2 < 2")
    assert got[4][0] == "skipped" and got[5][0] == "passed"


async def test_an_assert_s_operands_run_once_and_in_order(pool, registry) -> None:
    tests = ["seen = []\ndef left():\n    seen.append('l')\n    return add(1, 1)\ndef right():\n    seen.append('r')\n"
             "    return 2\nassert left() == right()\nassert seen == ['l', 'r']",
             "assert add(1, 1) == 2 == 2"]  # a chained comparison is left as it is
    scored = await record(pool, registry, ADD, tests, entry_point="add")
    assert scored.reward == 1.0, scored.execution.test_results


async def test_no_completion_code_runs_to_write_a_message(pool, registry) -> None:
    """An object of the completion's in a failing comparison is named by its kind, never by a
    ``__repr__`` of the completion's (which would run its code in the judge's message)."""
    code = ("class P:\n    def __repr__(self):\n        open('/tmp/repr-ran', 'w').write('x')\n        return 'FORGED'\n"
            "def make():\n    return P()\n")
    e = (await record(pool, registry, code, ["assert make() == 5"], entry_point="make", returns_objects=True)).execution
    [result] = e.test_results
    assert result.outcome in ("failed", "error") and "FORGED" not in result.message, result


async def test_rollstream_score_shows_the_failing_test(pool, registry, tmp_path, capsys) -> None:
    task = TaskSpec(task_id="t/add", prompt="add", reward=RewardSpec(entry_point="add", tests=[
        "assert add(1, 2) == 3", "assert add(2, 2) == 5"]))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"task": {"task_id": task.task_id, "prompt": "add",
                                          "reward": {"entry_point": "add", "tests": list(task.reward.tests)}},
                                 "completion": f"```python\n{ADD}```"}) + "\n")
    out = io.StringIO()
    counts = await score_file(Config(), [str(pairs)], out, backend=pool, registry=registry)
    assert counts["scored"] == 1
    verdict = json.loads(out.getvalue())
    assert [r["outcome"] for r in verdict["execution"]["test_results"]] == ["passed", "failed"]
    assert "test 1 failed: AssertionError: 4 == 5" in capsys.readouterr().err
