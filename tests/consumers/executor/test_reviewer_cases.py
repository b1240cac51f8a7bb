"""A security reviewer's cases, kept as the reviewer wrote them (tests/consumers/executor/reviewer_cases/),
through the real sandbox with the task's reference checked as the
executor checks it.

* ``attacks_*``: wrong code that scored full before the fixes: code run in the judge by
  ``logging.config`` from the completion's data and by the import system through a link, pickles
  naming the tests' imported mocks, warnings that are also ``StopIteration``, containers re-sent
  to a point where objects were allowed, exception ids reused, ``__exit__`` swallowing the tests'
  errors, delegated ``eval``/``exec`` deciding both sides, a forged random state, names bound to
  tuples, autospec methods reset through their bound method;
* ``honest_*``: honest code the first fixes broke (a fluent ``return self`` the test ignores, a
  created node returned where the reference returns None, ``repr`` round trips).

Strict-mode cases (no reference: the completion's names are its own), the one honest form the
rules refuse on purpose (a context manager that swallows the tests' ``AssertionError``) and two
forms not honoured (``LEFT_OUT``) are left out; docs/executor.md says why.
"""

from __future__ import annotations

import importlib
import uuid

import pytest

from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.consumers.executor.score import evaluate
from rollstream.schemas.events import RewardSpec
from tests.consumers.executor.test_verdicts import PROBE_SPY

pytestmark = pytest.mark.sandbox

LEFT_OUT = {"A10b-exception-name-Exception-noref", "H49-cm-swallows-assertion-on-purpose",
            # not honoured, documented: a zoneinfo time zone does not cross; a pickle of the tests' own
            # namedtuple instances made by the completion comes back as the completion's objects
            "H41-zoneinfo-datetime-both-ways", "H15f-pickle-file-tests-namedtuple"}
DESERVED = {"A13-delegated-exec-globals-rebinds-check": 1 / 3 + 1e-9}  # one of its three tests is right


FILES = ("attacks_a1", "attacks_a2", "attacks_b5", "attacks_b6", "honest_b7")


def cases(kind: str) -> list:
    """The review's cases of one kind: its attacks are named A..., its honest forms H..."""
    found: dict[str, object] = {}
    for name in FILES:
        module = importlib.import_module(f"tests.consumers.executor.reviewer_cases.{name}")
        for case in module.CASES:  # (a case the reviewer kept in two files runs once)
            if case[0] not in LEFT_OUT and case[0][0] == ("A" if kind == "attacks" else "H"):
                found.setdefault(case[0], pytest.param(case[0], case[1], case[2], id=case[0]))
    return list(found.values())


async def scored(pool, registry, spec: dict, code: str):
    spec = RewardSpec(**{"timeout_s": 10.0, **spec})
    references = ReferenceChecks(pool) if spec.reference else None
    return await evaluate(pool, registry, spec, f"```python\n{code}```", f"reviewer/{uuid.uuid4().hex[:6]}",
                          references=references)


@pytest.mark.parametrize("name, spec, code", cases("attacks"))
async def test_attack_scores_below_full(pool, registry, name, spec, code) -> None:
    evaluation = await scored(pool, registry, spec, code)
    events = [e for e in evaluation.result.events if e.get("e") in ("test", "tamper")] if evaluation.result else []
    assert evaluation.scored.reward <= DESERVED.get(name, 0.0), (evaluation.scored.execution, events)
    probe = await evaluate(pool, registry, RewardSpec(tests=["assert spy() == []"], entry_point="spy"), PROBE_SPY,
                           "reviewer/probe")
    assert probe.scored.reward == 1.0, probe.result.events  # nothing reached the next job


@pytest.mark.parametrize("name, spec, code", cases("honest"))
async def test_honest_code_scores_full(pool, registry, name, spec, code) -> None:
    evaluation = await scored(pool, registry, spec, code)
    events = [e for e in evaluation.result.events if e.get("e") == "test" and not e.get("ok")] if evaluation.result else []
    assert evaluation.scored.reward == 1.0, (evaluation.scored.execution, events)


def test_the_review_cases_load() -> None:
    assert len(cases("attacks")) >= 20 and len(cases("honest")) >= 4
