"""The task mixture: which task each position of an epoch issues. Pure: no I/O.

An epoch is a fixed sequence of ``L`` positions (``L`` = number of tasks in families with a
positive weight). ``epoch_plan`` maps (tasks, family probabilities, seed, epoch, adaptive
scores) to that sequence deterministically, so a sampler that restarts at position ``p`` of
epoch ``e`` continues with exactly the tasks it would have issued.

* **Family weights.** Family ``f`` gets probability ``p_f ∝ w_f`` (``w_f`` from
  ``sampler.family_weights``, default 1). With ``family_temperature`` ``T > 0`` the weight is
  ``w_f * n_f ** (1 / T)`` where ``n_f`` is the family's size: ``T = 1`` samples tasks
  uniformly (big families more often), large ``T`` tends to uniform over families.
  Each epoch gives family ``f`` exactly ``round(p_f * L)`` positions (largest remainder),
  in a seeded, stratified interleaving (every prefix of an epoch follows the weights).
* **Within a family**, the ``c_f`` positions go to tasks in proportion to
  ``1 - s + s * score_t`` (``s`` = ``adaptive_strength``), where ``score_t`` in [0, 1] is the
  fraction of the task's recent groups whose rewards had non-zero variance (tasks without
  feedback yet score 1: worth trying). Without feedback every task of a family is equally
  likely, and with ``c_f == n_f`` each task is issued exactly once per epoch.
* **Adaptive statistics** (``AdaptiveStats``) are fed from the ``advantages`` topic; the
  sampler snapshots them at the start of each epoch and persists the snapshot, so the plan
  of an epoch never changes once started.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence


def family_probabilities(sizes: Mapping[str, int], weights: Mapping[str, float],
                         temperature: float = 0.0) -> dict[str, float]:
    """Probability of each family (families with weight 0 or no tasks are left out)."""
    raw: dict[str, float] = {}
    for family, size in sorted(sizes.items()):
        weight = float(weights.get(family, 1.0))
        if size <= 0 or weight <= 0.0:
            continue
        if temperature > 0.0:
            weight *= size ** (1.0 / temperature)
        raw[family] = weight
    total = sum(raw.values())
    if not raw or not math.isfinite(total) or total <= 0.0:
        raise ValueError(f"no family has a positive weight (sizes {dict(sizes)}, weights {dict(weights)})")
    return {family: weight / total for family, weight in raw.items()}


def apportion(shares: Mapping[str, float], total: int, rng: random.Random) -> dict[str, int]:
    """Split ``total`` integer slots by ``shares`` (largest remainder; ties broken by ``rng``)."""
    norm = sum(shares.values())
    exact = {key: total * share / norm for key, share in shares.items()}
    counts = {key: int(math.floor(value)) for key, value in exact.items()}
    left = total - sum(counts.values())
    order = sorted(exact, key=lambda k: (-(exact[k] - counts[k]), rng.random(), k))
    for key in order[:left]:
        counts[key] += 1
    return counts


def systematic(shares: Mapping[str, float], total: int, rng: random.Random) -> dict[str, int]:
    """Draw ``total`` slots by systematic sampling: each key gets floor or ceil of its expected
    count ``total * share``, and exactly the expected count on average over draws."""
    keys = list(shares)
    rng.shuffle(keys)  # which keys get the ceil must not depend on their order
    norm = sum(shares.values())
    counts = dict.fromkeys(keys, 0)
    if total <= 0:
        return counts
    step = norm / total
    point = rng.random() * step
    cumulative = 0.0
    for k in keys:
        cumulative += shares[k]
        while point < cumulative and sum(counts.values()) < total:
            counts[k] += 1
            point += step
    counts[keys[-1]] += total - sum(counts.values())  # float round-off at the very end
    return counts


def task_weight(score: float | None, strength: float) -> float:
    """Relative chance of a task inside its family given its informativeness score."""
    return 1.0 - strength + strength * (1.0 if score is None else score)


def epoch_plan(families: Sequence[str], probabilities: Mapping[str, float], *, seed: int, epoch: int,
               scores: Mapping[int, float] | None = None, strength: float = 0.0) -> list[int]:
    """The task indices of every position of ``epoch``.

    ``families[i]`` is the family of task ``i``; ``scores`` maps task index -> informativeness
    in [0, 1] (missing: no feedback yet).
    """
    rng = random.Random(f"rollstream-mixture:{seed}:{epoch}")  # str seeds hash via sha512: stable
    members: dict[str, list[int]] = defaultdict(list)
    for index, family in enumerate(families):
        if family in probabilities:
            members[family].append(index)
    length = sum(len(v) for v in members.values())
    slots = apportion({f: probabilities[f] for f in members}, length, rng)
    queues: dict[str, list[int]] = {}
    for family in sorted(members):
        tasks = members[family]
        shares = {str(t): task_weight((scores or {}).get(t), strength) for t in tasks}
        if sum(shares.values()) <= 0.0:  # strength 1 and every task uninformative: fall back to uniform
            shares = {key: 1.0 for key in shares}
        per_task = systematic(shares, slots[family], rng)
        queue = [int(t) for t, count in per_task.items() for _ in range(count)]
        rng.shuffle(queue)
        queues[family] = queue
    # Stratified interleaving: the k-th position of family f lands at (k + jitter) / c_f of the
    # epoch, so every prefix of the plan (a partially issued epoch) follows the weights closely.
    keyed = [((k + rng.random()) / len(queue), family) for family, queue in sorted(queues.items())
             for k in range(len(queue))]
    order = [family for _, family in sorted(keyed)]
    cursor: dict[str, int] = defaultdict(int)
    plan = []
    for family in order:
        plan.append(queues[family][cursor[family]])
        cursor[family] += 1
    return plan


class AdaptiveStats:
    """Recent informativeness per task: was a group's reward variance non-zero?

    Keeps the last ``window`` outcomes of each task. ``score`` is the informative fraction.
    """

    def __init__(self, window: int = 4) -> None:
        self.window = window
        self._recent: dict[str, deque[float]] = {}

    def record(self, task_id: str, informative: bool) -> None:
        self._recent.setdefault(task_id, deque(maxlen=self.window)).append(1.0 if informative else 0.0)

    def restore(self, snapshot: Mapping[str, float]) -> None:
        """Seed from a persisted snapshot (each score counts as one past outcome)."""
        for task_id, score in snapshot.items():
            self._recent.setdefault(task_id, deque(maxlen=self.window)).append(float(score))

    def score(self, task_id: str) -> float | None:
        outcomes = self._recent.get(task_id)
        return sum(outcomes) / len(outcomes) if outcomes else None

    def snapshot(self) -> dict[str, float]:
        """task id -> score of every task with feedback (what an epoch's plan is built from)."""
        return {task_id: sum(v) / len(v) for task_id, v in sorted(self._recent.items()) if v}

    def family_scores(self, family_of: Mapping[str, str]) -> dict[str, float]:
        """Mean score per family over tasks with feedback (for metrics)."""
        sums: dict[str, list[float]] = defaultdict(list)
        for task_id, score in self.snapshot().items():
            if task_id in family_of:
                sums[family_of[task_id]].append(score)
        return {family: sum(v) / len(v) for family, v in sums.items()}


def informative(reward_std: float, eps: float = 1e-9) -> bool:
    """A group teaches GRPO something only when its rewards differ."""
    return reward_std > eps
