"""Figures of an evaluation: pass@k per family, format told apart from correctness, bootstrap
intervals, and forgetting. Pure functions over :class:`evaluator.play.SampleResult` s.

* pass@k is the unbiased estimator of Chen et al. (2021), averaged over tasks;
* next to pass@1 come the shares of samples whose last turn had a code block, parsed and ran
  without an error, and pass@1 among each of those (``pass@1|code``, ``pass@1|parses``,
  ``pass@1|runs``), so that a gain in format is never read as a gain in correctness;
* a family's interval is a percentile bootstrap of pass@1 resampling its tasks, then the samples
  within each task;
* a family is *forgetting* when its interval's upper bound lies below its best earlier pass@1
  (so the noise of a small live subset does not raise it).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ALL = "ALL"
EVALS_FILE = "evals.jsonl"  # the evaluator's reports, beside the learner's steps.jsonl (what `rollstream run` shows)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per task, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _share(passed: int, of: int) -> float | None:
    return passed / of if of else None


def scored(results: Iterable[Any]) -> list[Any]:
    """The samples with a verdict: one whose outcome is ``infra`` (the machinery failed under it,
    every run) says nothing of the policy and counts in no figure."""
    return [r for r in results if getattr(r, "error_kind", "") != "infra"]


def summarize(results: Iterable[Any], ks: Sequence[int]) -> dict[str, dict[str, Any]]:
    """family -> {tasks, samples, passed, tasks_solved, mean_reward, pass@k..., with_code, parses,
    runs, pass@1|code, pass@1|parses, pass@1|runs, infra}; plus "ALL" over every task. Samples
    the machinery lost (``infra``) are counted apart and left out of every other figure."""
    results = list(results)
    lost: dict[str, int] = defaultdict(int)
    for r in results:
        if getattr(r, "error_kind", "") == "infra":
            lost[r.family] += 1
            lost[ALL] += 1
    per_task: dict[str, list[Any]] = defaultdict(list)
    for r in scored(results):
        per_task[r.task_id].append(r)
    by_family: dict[str, list[list[Any]]] = defaultdict(list)
    for samples in per_task.values():
        by_family[samples[0].family].append(samples)
        by_family[ALL].append(samples)
    summary = {}
    for family in sorted(by_family, key=lambda f: (f == ALL, f)):
        groups = by_family[family]
        flat = [r for g in groups for r in g]
        row: dict[str, Any] = {
            "tasks": len(groups),
            "samples": len(flat),
            "passed": sum(r.passed for r in flat),
            "tasks_solved": sum(any(r.passed for r in g) for g in groups),
            "mean_reward": sum(r.reward for r in flat) / max(1, len(flat)),
        }
        for k in ks:
            usable = [g for g in groups if len(g) >= k]
            row[f"pass@{k}"] = (sum(pass_at_k(len(g), sum(r.passed for r in g), k) for g in usable) / len(usable)
                                if usable else None)
        for name, attribute in (("code", "has_code"), ("parses", "parses"), ("runs", "ran")):
            kept = [r for r in flat if getattr(r, attribute, True)]
            row[{"code": "with_code"}.get(name, name)] = _share(len(kept), len(flat))
            row[f"pass@1|{name}"] = _share(sum(r.passed for r in kept), len(kept))
        row["infra"] = lost.get(family, 0)
        summary[family] = row
    return summary


def bootstrap_pass1(results: Iterable[Any], *, resamples: int = 1000, level: float = 0.9, seed: int = 0
                    ) -> dict[str, tuple[float, float]]:
    """family -> (low, high): a percentile bootstrap interval of pass@1, resampling the family's
    tasks and then each chosen task's samples (``ALL`` too)."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    family_of: dict[str, str] = {}
    for r in scored(results):
        per_task[r.task_id].append(bool(r.passed))
        family_of[r.task_id] = r.family
    by_family: dict[str, list[list[bool]]] = defaultdict(list)
    for task, outcomes in per_task.items():
        by_family[family_of[task]].append(outcomes)
        by_family[ALL].append(outcomes)
    out = {}
    for family, tasks in by_family.items():
        rng = random.Random(f"{seed}/{family}")
        means = []
        for _ in range(resamples):
            chosen = rng.choices(tasks, k=len(tasks))
            means.append(sum(sum(rng.choices(t, k=len(t))) / len(t) for t in chosen) / len(chosen))
        means.sort()
        low = means[int((1 - level) / 2 * resamples)]
        high = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
        out[family] = (low, high)
    return out


def forgetting(intervals: Mapping[str, tuple[float, float]], best: Mapping[str, float]) -> dict[str, bool]:
    """family -> whether its interval's upper bound lies below its best earlier pass@1."""
    return {family: family in best and high < best[family] for family, (_, high) in intervals.items()}


def task_digest(task_ids: Iterable[str]) -> str:
    """A digest of a set of task ids (order does not matter)."""
    return hashlib.sha256("\n".join(sorted(set(task_ids))).encode()).hexdigest()[:32]
