"""Tasks, below every stage: the task sources (``sources.py``: builtin, jsonl, HumanEval, local
datasets) and the built-in suite (``suite/``). The sampler, the simulated backends, ``replay`` and
``eval`` all read tasks from here."""

from typing import Literal

Domain = Literal["code", "math"]
DOMAINS: tuple[Domain, ...] = ("code", "math")


def domain_of(kind: str) -> Domain:
    """The domain of a task whose reward has kind ``kind`` (``RewardSpec.kind``): ``"math"`` for
    ``math_answer`` (an answer compared with a gold one), ``"code"`` for every other kind (a program
    run against tests). The one place a task's domain is decided: the evaluator's per-domain pass@1
    and forgetting alert read it (a task family named "math" of code tasks is in domain "code").

    >>> domain_of("math_answer"), domain_of("python_tests"), domain_of("python_pytest")
    ('math', 'code', 'code')
    """
    return "math" if kind == "math_answer" else "code"
