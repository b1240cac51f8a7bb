"""Group-relative advantage estimators: pure functions, no I/O.

Every estimator takes a group's rewards (one prompt, G samples) and returns one advantage
per rollout, in the same order:

* ``grpo``    A_i = (r_i - mean(r)) / (std + eps)             (DeepSeekMath GRPO)
* ``dr_grpo`` A_i =  r_i - mean(r)                            (Dr. GRPO: no std division)
* ``rloo``    A_i =  r_i - mean_{j != i}(r_j)                  (REINFORCE leave-one-out)

``std`` is the sample standard deviation (ddof = 1, as TRL and verl use). The baseline is
always the group's own (that is what makes them group-relative); ``normalize`` only picks
where GRPO's std comes from:

* ``group``: the group's own rewards (the classic GRPO definition);
* ``task``:  all rewards of groups of the same ``task_id`` in the batch being emitted;
* ``family``: all rewards of groups of the same task family in the batch being emitted (multi-task
  training: each family's rewards on their own scale);
* ``batch``: all rewards of the batch being emitted (group mean, batch std: "Lite PPO").

``dr_grpo`` and ``rloo`` never divide, so ``normalize`` does not change them.

Edge cases, chosen so that no rollout carries a signal it does not have:

* a single rollout has no baseline to compare to: its advantage is 0 (all estimators);
* all-equal rewards give all-zero advantages (GRPO: 0 / (0 + eps) = 0);
* NaN or +-inf rewards raise :class:`ValueError` (the wire schema bounds rewards, so such
  a value means a bug upstream, not a sample to learn from).

Rewards are optionally clipped to ``[-reward_clip, reward_clip]`` before anything else.
Zero-variance groups (after clipping) can be filtered; :func:`filter_reason` names why.

**More estimators** register by name, like reward kinds: :func:`register_estimator` in the
stream's process, or an entry point of the group ``rollstream.estimators`` (an
:class:`AdvantageEstimator`, or a function ``(rewards, scale, std_eps) -> advantages``) that every
stream process loads; ``stream.estimator`` names one, and the stream refuses to start with a name
nobody registered (the error lists the registered ones). Example::

    from rollstream.streams.estimators import register_estimator

    register_estimator("max_baseline", lambda rewards, scale, eps: [r - max(rewards) for r in rewards])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from rollstream.registry import Registry
from rollstream.stats import mean, sample_std  # noqa: F401 (sample_std: estimators' plugins use it from here)

Normalize = Literal["group", "task", "family", "batch"]
NORMALIZE: tuple[str, ...] = ("group", "task", "family", "batch")

# Reasons a group is not emitted (metric label values; keep the set small and fixed).
ZERO_VARIANCE = "zero_variance"
SINGLE_ROLLOUT = "single_rollout"
INCOMPLETE = "incomplete"
INFRA = "infra"  # too few samples left once those the machinery lost (outcome infra) were left out


@dataclass(frozen=True, slots=True)
class RewardStats:
    mean: float
    std: float  # sample std (ddof=1); 0 for fewer than two rewards
    min: float
    max: float


def check_finite(rewards: Sequence[float]) -> None:
    """Raise ValueError naming the first NaN/inf reward."""
    for i, r in enumerate(rewards):
        if not math.isfinite(r):
            raise ValueError(f"reward {i} is {r!r}; rewards must be finite")


def clip_rewards(rewards: Sequence[float], reward_clip: float | None) -> list[float]:
    """Rewards clipped to [-reward_clip, reward_clip] (unchanged when ``reward_clip`` is None)."""
    check_finite(rewards)
    if reward_clip is None:
        return [float(r) for r in rewards]
    if not reward_clip > 0:
        raise ValueError(f"reward_clip must be > 0, got {reward_clip!r}")
    return [min(max(float(r), -reward_clip), reward_clip) for r in rewards]


def reward_stats(rewards: Sequence[float]) -> RewardStats:
    check_finite(rewards)
    if not rewards:
        raise ValueError("a group needs at least one reward")
    return RewardStats(mean(rewards), sample_std(rewards), min(rewards), max(rewards))


def is_zero_variance(rewards: Sequence[float]) -> bool:
    """True when every reward equals the first (the group carries no learning signal)."""
    return all(r == rewards[0] for r in rewards)


def filter_reason(rewards: Sequence[float], filter_zero_variance: bool) -> str | None:
    """Why a group with these (clipped) rewards should not be emitted, or None to emit it."""
    check_finite(rewards)
    if not filter_zero_variance:
        return None
    if len(rewards) < 2:
        return SINGLE_ROLLOUT
    if is_zero_variance(rewards):
        return ZERO_VARIANCE
    return None


@dataclass(frozen=True, slots=True)
class AdvantageEstimator:
    """A registered estimator. ``advantages(rewards, scale, std_eps)`` gets a group of at least two
    finite rewards; ``scale`` is the std of the ``normalize`` scope when the estimator is
    ``scaled`` (None: the group's own), and is None for the others."""

    name: str
    advantages: Callable[[Sequence[float], float | None, float], list[float]]
    scaled: bool = False  # divides by a std, so stream.normalize chooses whose


def _grpo(rewards: Sequence[float], scale: float | None, std_eps: float) -> list[float]:
    scale = sample_std(rewards) if scale is None else scale
    if not scale >= 0 or not math.isfinite(scale):
        raise ValueError(f"std must be finite and >= 0, got {scale!r}")
    m = mean(rewards)
    return [(r - m) / (scale + std_eps) for r in rewards]


def _dr_grpo(rewards: Sequence[float], scale: float | None, std_eps: float) -> list[float]:
    m = mean(rewards)
    return [r - m for r in rewards]


def _rloo(rewards: Sequence[float], scale: float | None, std_eps: float) -> list[float]:
    total, n = math.fsum(rewards), len(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def _as_estimator(name: str, obj: Any) -> AdvantageEstimator:
    return obj if isinstance(obj, AdvantageEstimator) else AdvantageEstimator(name, obj)


ENTRY_POINTS = "rollstream.estimators"
_BUILT_IN = (AdvantageEstimator("grpo", _grpo, scaled=True), AdvantageEstimator("dr_grpo", _dr_grpo),
             AdvantageEstimator("rloo", _rloo))
ESTIMATORS: tuple[str, ...] = tuple(e.name for e in _BUILT_IN)
REGISTRY: Registry[AdvantageEstimator] = Registry("advantage estimator", ENTRY_POINTS, "register_estimator",
                                                  {e.name: e for e in _BUILT_IN}, _as_estimator)


def register_estimator(name: str, advantages: Callable[[Sequence[float], float | None, float], list[float]]
                       | AdvantageEstimator, *, scaled: bool = False) -> AdvantageEstimator:
    """Register an estimator under ``name`` (replacing one of that name) and return it."""
    return REGISTRY.register(name, advantages if isinstance(advantages, AdvantageEstimator)
                             else AdvantageEstimator(name, advantages, scaled=scaled))


def load_entry_points(found: Iterable[metadata.EntryPoint] | None = None) -> None:
    """Register every estimator of the ``rollstream.estimators`` entry-point group (once)."""
    REGISTRY.load_entry_points(found)


def estimator_names() -> list[str]:
    return REGISTRY.names()


def get_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; ValueError naming the registered ones otherwise."""
    return REGISTRY.get(name)


def group_advantages(
    rewards: Sequence[float],
    estimator: str = "grpo",
    *,
    std_eps: float = 1e-6,
    std: float | None = None,
) -> list[float]:
    """Advantages of one group, in input order.

    ``std`` overrides a scaled estimator's divisor (the std of the normalisation scope); None: the
    group's own sample std.
    """
    check_finite(rewards)
    found = get_estimator(estimator)
    n = len(rewards)
    if n == 0:
        raise ValueError("a group needs at least one reward")
    if n == 1:
        return [0.0]
    advantages = [float(a) for a in found.advantages(rewards, std if found.scaled else None, std_eps)]
    if len(advantages) != n:
        raise ValueError(f"estimator {estimator!r} gave {len(advantages)} advantages for {n} rewards")
    check_finite(advantages)
    return advantages


@dataclass(frozen=True, slots=True)
class GroupInput:
    """One group of a batch: its task and family (for ``normalize = "task"`` / ``"family"``) and its
    clipped rewards."""

    task_id: str
    rewards: Sequence[float]
    family: str = ""


def batch_advantages(
    groups: Sequence[GroupInput],
    estimator: str = "grpo",
    normalize: Normalize = "group",
    *,
    std_eps: float = 1e-6,
) -> list[list[float]]:
    """Advantages of every group of a batch, ``result[g][i]`` for rollout i of group g.

    Centring is per group; for a scaled estimator (GRPO) the std comes from the ``normalize`` scope.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"unknown normalize {normalize!r}; known: {', '.join(NORMALIZE)}")
    for group in groups:
        check_finite(group.rewards)
    scope_std: dict[str, float] = {}
    scope = {"batch": lambda g: "", "task": lambda g: g.task_id, "family": lambda g: g.family,
             "group": lambda g: None}[normalize]
    if get_estimator(estimator).scaled and normalize != "group":
        pooled: dict[str, list[float]] = {}
        for g in groups:
            pooled.setdefault(scope(g), []).extend(g.rewards)
        scope_std = {key: sample_std(rewards) for key, rewards in pooled.items()}
    return [
        group_advantages(g.rewards, estimator, std_eps=std_eps,
                         std=scope_std.get(scope(g)) if normalize != "group" else None)
        for g in groups
    ]
