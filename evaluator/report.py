"""Figures of an evaluation: pass@k per family, format told apart from correctness, bootstrap
intervals, and forgetting. Pure functions over :class:`evaluator.play.SampleResult` s.

* pass@k is the unbiased estimator of Chen et al. (2021), averaged over tasks;
* next to pass@1 come the shares of samples whose last turn had a code block, parsed and ran
  without an error, and pass@1 among each of those (``pass@1|code``, ``pass@1|parses``,
  ``pass@1|runs``), so that a gain in format is never read as a gain in correctness;
* a family's interval is a percentile bootstrap of pass@1 resampling its tasks, then the samples
  within each task;
* a family is *forgetting* when its interval's upper bound lies below its best earlier pass@1
  (so the noise of a small live subset does not raise it);
* the same per *domain* (``rollstream.tasks.domain_of``: "code", "math"; a sample's ``domain``):
  pass@1 over the domain's tasks, its interval, forgetting, and *rising* (the interval's lower
  bound above its best earlier pass@1: beyond the noise, as forgetting is); :func:`trade_offs` names a domain forgetting while another rises (joint training
  trading one for the other).
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


def _group(r: Any, by: str) -> str:
    return getattr(r, by, "code") if by == "domain" else r.family


def bootstrap_pass1(results: Iterable[Any], *, resamples: int = 1000, level: float = 0.9, seed: int = 0,
                    by: str = "family") -> dict[str, tuple[float, float]]:
    """family -> (low, high): a percentile bootstrap interval of pass@1, resampling the family's
    tasks and then each chosen task's samples (``ALL`` too). ``by="domain"``: per domain instead
    (no ``ALL``: it is the families' ``ALL``)."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    group_of: dict[str, str] = {}
    for r in scored(results):
        per_task[r.task_id].append(bool(r.passed))
        group_of[r.task_id] = _group(r, by)
    by_group: dict[str, list[list[bool]]] = defaultdict(list)
    for task, outcomes in per_task.items():
        by_group[group_of[task]].append(outcomes)
        if by == "family":
            by_group[ALL].append(outcomes)
    out = {}
    for group, tasks in by_group.items():
        rng = random.Random(f"{seed}/{group}" if by == "family" else f"{seed}/{by}:{group}")
        means = []
        for _ in range(resamples):
            chosen = rng.choices(tasks, k=len(tasks))
            means.append(sum(sum(rng.choices(t, k=len(t))) / len(t) for t in chosen) / len(chosen))
        means.sort()
        low = means[int((1 - level) / 2 * resamples)]
        high = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
        out[group] = (low, high)
    return out


def forgetting(intervals: Mapping[str, tuple[float, float]], best: Mapping[str, float]) -> dict[str, bool]:
    """family -> whether its interval's upper bound lies below its best earlier pass@1."""
    return {family: family in best and high < best[family] for family, (_, high) in intervals.items()}


def domains(results: Iterable[Any], best: Mapping[str, float], *, resamples: int = 1000, level: float = 0.9,
            seed: int = 0) -> dict[str, dict[str, Any]]:
    """domain -> {tasks, samples, pass1, ci_low, ci_high, best_before, forgetting, rising}: pass@1
    averaged over the domain's tasks (as a family's), its bootstrap interval, the domain's best
    earlier pass@1 (``best``), forgetting (the interval's upper bound below that best) and rising
    (its lower bound above it: a rise beyond the noise, so that chance alone pairs no domain with a
    forgetting one). Samples lost to ``infra`` count nowhere, as in :func:`summarize`."""
    results = scored(results)
    per_task: dict[str, list[Any]] = defaultdict(list)
    for r in results:
        per_task[r.task_id].append(r)
    by_domain: dict[str, list[list[Any]]] = defaultdict(list)
    for samples in per_task.values():
        by_domain[_group(samples[0], "domain")].append(samples)
    intervals = bootstrap_pass1(results, resamples=resamples, level=level, seed=seed, by="domain")
    flagged = forgetting(intervals, best)
    out = {}
    for domain in sorted(by_domain):
        groups = by_domain[domain]
        pass1 = sum(sum(r.passed for r in g) / len(g) for g in groups) / len(groups)
        low, high = intervals[domain]
        before = best.get(domain)
        out[domain] = {"tasks": len(groups), "samples": sum(len(g) for g in groups), "pass1": pass1,
                       "ci_low": low, "ci_high": high, "best_before": before, "forgetting": flagged[domain],
                       "rising": before is not None and low > before}
    return out


def best_after(best: Mapping[str, float], rows: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The best pass@1 per domain (or family) once ``rows`` (:func:`domains`) are in."""
    out = dict(best)
    for name, row in rows.items():
        if row.get("pass1") is not None:
            out[name] = max(out.get(name, 0.0), row["pass1"])
    return out


def trade_offs(rows: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(forgetting, rising) pairs of :func:`domains` rows: one domain fell below its best by more
    than its noise while another rose above its own (the mixture trades one for the other)."""
    return [(down, up) for down, d in rows.items() if d["forgetting"]
            for up, u in rows.items() if up != down and u["rising"]]


def task_digest(task_ids: Iterable[str]) -> str:
    """A digest of a set of task ids (order does not matter)."""
    return hashlib.sha256("\n".join(sorted(set(task_ids))).encode()).hexdigest()[:32]
