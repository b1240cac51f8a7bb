"""Per-test results, pure parts (issue 40): from the judge's events to bounded TestResults, the
judge's plain-data messages, the assert rewrite's semantics, and replay's test-by-test diff."""

from __future__ import annotations

import ast

import pytest

from rollstream.consumers.executor.rewards import per_test_results
from rollstream.consumers.executor.runtime.jobrun import EXPLAIN, explained_asserts
from rollstream.consumers.executor.runtime.judge import explain, plain_repr
from rollstream.consumers.executor.score import failed_test_lines
from rollstream.schemas.events import MAX_TEST_MESSAGES, MAX_TEST_RESULTS, ExecutionRecord, TestResult

pytestmark = pytest.mark.unit


def test_events_become_results_in_test_order_with_a_failure_winning() -> None:
    events = [{"e": "test", "i": 2, "ok": False, "type": "ZeroDivisionError", "msg": "division by zero", "d": 0.5},
              {"e": "test", "i": 0, "ok": True, "d": 0.001},
              {"e": "test", "i": 1, "ok": False, "type": "AssertionError", "msg": "4 == 5"},
              {"e": "test", "i": 1, "ok": True},  # a later pass for the same index does not erase the failure
              {"e": "test", "i": 3, "ok": False, "skip": True, "type": "SkipTest", "msg": "later"},
              {"e": "test", "i": 4, "ok": False, "type": "SkipTest", "msg": "skipped: the completion caused it"},
              {"e": "test", "i": 9, "ok": True}, {"e": "test", "i": "x", "ok": True}, {"e": "other"}]
    results, omitted = per_test_results(events, 5)
    assert [(r.index, r.outcome, r.error_type) for r in results] == [
        (0, "passed", ""), (1, "failed", "AssertionError"), (2, "error", "ZeroDivisionError"), (3, "skipped", "SkipTest"),
        (4, "failed", "SkipTest")]
    assert results[1].message == "4 == 5" and results[2].duration_s == 0.5 and omitted == 0


def test_results_are_bounded_and_the_rest_counted() -> None:
    many = [{"e": "test", "i": i, "ok": True} for i in range(MAX_TEST_RESULTS + 10)]
    results, omitted = per_test_results(many, MAX_TEST_RESULTS + 10)
    assert len(results) == MAX_TEST_RESULTS and omitted == 10
    loud = [{"e": "test", "i": i, "ok": False, "type": "AssertionError", "msg": "x" * 2000} for i in range(20)]
    results, omitted = per_test_results(loud, 20)
    assert sum(len(r.message) for r in results) <= MAX_TEST_MESSAGES and len(results) + omitted == 20
    ExecutionRecord(sandbox_id="", exit_code=0, duration_s=0.0, error_kind="none", test_results=results)


class _Proxy:  # stands for a completion object's proxy in the judge
    def __repr__(self) -> str:
        raise AssertionError("a completion's __repr__ must never be called")


def test_messages_show_plain_data_only() -> None:
    assert explain([1, "a", {"k": (2,)}], "==", None) == "[1, 'a', {'k': (2,)}] == None"
    assert explain(2 ** 300, "<", 1.5) == "<int of 301 bits> < 1.5"
    assert "... (5000 long)" in plain_repr("y" * 5000)
    assert explain(_Proxy(), "==", [_Proxy()]) == "<an object> == [<an object>]"
    assert len(plain_repr(list(range(10_000)))) < 200


def test_the_rewrite_keeps_each_assert_s_evaluation() -> None:
    source = ("calls = []\ndef v(x):\n    calls.append(x)\n    return x\n"
              "assert v(1) == v(1)\nassert v(2) in [v(2)]\nassert v(3) < v(4) < v(5)\nassert v(6), 'own'\n"
              "class C:\n    assert v(7) is not None\n")
    tree = explained_asserts(ast.parse(source))
    namespace = {EXPLAIN: explain}
    exec(compile(tree, "<test 0>", "exec"), namespace)
    assert namespace["calls"] == [1, 1, 2, 2, 3, 4, 5, 6, 7]
    try:
        exec(compile(explained_asserts(ast.parse("assert [1] + [2] == [1, 3]")), "<test 1>", "exec"), {EXPLAIN: explain})
    except AssertionError as exc:
        assert str(exc) == "[1, 2] == [1, 3]"
    else:
        raise AssertionError("the assert passed")
    kept = explained_asserts(ast.parse("assert 1 == 2, 'mine'\nassert 1 < 2 < 0"))
    assert ast.unparse(kept) == "assert 1 == 2, 'mine'\nassert 1 < 2 < 0"  # own message, chains: unchanged


def test_failed_test_lines_and_replay_s_diff() -> None:
    from rollstream.replay import Item, Outcome
    from rollstream.testing import make_action, make_reward

    execution = {"test_results": [{"index": 0, "outcome": "passed"},
                                  {"index": 1, "outcome": "failed", "error_type": "AssertionError", "message": "4 == 5"}],
                 "test_results_omitted": 2}
    assert failed_test_lines(execution) == ["test 1 failed: AssertionError: 4 == 5",
                                            "(2 tests' results not recorded: over the verdict's bound)"]
    import msgspec

    before = make_reward()
    passed = [TestResult(index=0, outcome="passed"), TestResult(index=1, outcome="passed")]
    now = [TestResult(index=0, outcome="passed"),
           TestResult(index=1, outcome="failed", error_type="AssertionError", message="4 == 5")]
    old = msgspec.structs.replace(before, execution=msgspec.structs.replace(before.execution, test_results=passed))
    new = msgspec.structs.replace(before, execution=msgspec.structs.replace(before.execution, test_results=now))
    outcome = Outcome(Item(0, 0, 0, make_action(), old), new)
    assert outcome.test_changes == ["test 1 now fails (was passed): AssertionError: 4 == 5"]
    assert Outcome(Item(0, 0, 0, make_action(), before), new).test_changes == []  # nothing recorded before


def test_a_pytest_file_s_tests_are_counted_as_collected_and_named_by_node_id() -> None:
    from rollstream.consumers.executor.rewards import tests_total
    from rollstream.consumers.executor.runtime.zygotes import event_line
    from rollstream.schemas.events import RewardSpec

    spec = RewardSpec(kind="python_pytest", tests=["file 0", "file 1", "file 2"])
    events = [{"e": "collected", "n": 3}, {"e": "collected", "n": 1}]  # the third file never reported
    assert tests_total(spec, events) == 3 + 1 + 1
    assert tests_total(spec, [{"e": "collected", "n": 10**9}]) == 3  # out of bounds: the file counts as one
    assert tests_total(RewardSpec(tests=["assert 1", "assert 2"]), events) == 2  # statements: one each
    event = {"e": "test", "i": 1, "ok": False, "node": "test_solution.py::test_a[2]", "type": "AssertionError",
             "msg": "4 == 5", "d": 0.25}
    decoded = __import__("json").loads(event_line(event))  # as the runner writes it: the duration a number
    (result,), _ = per_test_results([decoded], 5)
    assert (result.node_id, result.duration_s, result.outcome) == ("test_solution.py::test_a[2]", 0.25, "failed")
