"""Code and math trained together: per-domain advantage normalisation and loss weights.

Pure functions, no I/O. A rollout's domain is ``Rollout.domain`` (the generator's
``rollstream.tasks.domain_of`` of its reward kind; empty in a rollout written before the field,
which is then a domain of its own: normalised alone, weight 1).

**Normalisation** (``learner.domain_normalize = "step"``): within one optimizer step, each domain's
advantages are divided by their sample standard deviation (ddof = 1, as the stream's estimators)
over the step's trained rollouts of that domain::

    A'_i = A_i / std({A_j : domain_j = domain_i})

so that every domain enters the step with unit-std advantages: 0/1 math answers and graded code
rewards pull with comparable force whatever the stream's estimator (``dr_grpo`` and ``rloo`` never
divide; ``grpo`` with ``normalize = "batch"`` pools both domains' rewards into one std). Baselines
are unchanged (advantages are only scaled, never re-centred: each group's are centred already); a
domain whose advantages have no spread (fewer than two, or all equal) is left as it is. With
``grpo`` per group each group's advantages have unit std already, so a domain of one group in the
step is left within 1e-6 of where it was.

**Loss weights** (``learner.domain_loss_weights``): each rollout's weight in the loss is its
domain's weight (not named: 1) times its family's (``learner.family_loss_weights``); None when
every weight is 1, so that the loss is computed exactly as without weights.

>>> domain_scales([("code", 1.0), ("code", -1.0), ("math", 0.5), ("math", -0.5)])
{'code': 0.7071067811865475, 'math': 1.414213562373095}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from rollstream.schemas.events import AdvantagedRollout
from rollstream.stats import sample_std


def domain_scales(advantages: Iterable[tuple[str, float]]) -> dict[str, float]:
    """``domain -> 1 / std`` of the ``(domain, advantage)`` pairs given (1.0 for a domain whose
    advantages have no spread). ValueError on a NaN or infinite advantage."""
    pooled: dict[str, list[float]] = {}
    for domain, advantage in advantages:
        if not math.isfinite(advantage):
            raise ValueError(f"advantage {advantage!r} of domain {domain!r}: advantages must be finite")
        pooled.setdefault(domain, []).append(float(advantage))
    scales = {}
    for domain, values in pooled.items():
        std = sample_std(values)
        scale = 1.0 / std if std > 0.0 else 1.0
        scales[domain] = scale if math.isfinite(scale) else 1.0  # a spread too small to invert: as it is
    return scales


def normalise_by_domain(items: Sequence[AdvantagedRollout], mode: str
                        ) -> tuple[list[AdvantagedRollout], dict[str, float]]:
    """The step's rollouts with each domain's advantages scaled to unit std (``mode`` "step"), and
    the scale each domain got; ``mode`` "none": the rollouts themselves, unchanged, and no scales
    (``mode`` is ``learner.domain_normalize``)."""
    if mode == "none":
        return list(items), {}
    if mode != "step":
        raise ValueError(f"unknown domain normalisation {mode!r}; expected 'none' or 'step'")
    scales = domain_scales((i.rollout.domain, i.advantage) for i in items)
    return [i if scales[i.rollout.domain] == 1.0
            else msgspec.structs.replace(i, advantage=i.advantage * scales[i.rollout.domain])
            for i in items], scales


def loss_weights(items: Sequence[AdvantagedRollout], family_weights: Mapping[str, float] | None = None,
                 domain_weights: Mapping[str, float] | None = None) -> list[float] | None:
    """Each rollout's weight in the loss: its family's times its domain's (not named: 1); None
    when no weight is configured or every one is 1."""
    if not family_weights and not domain_weights:
        return None
    family_weights, domain_weights = family_weights or {}, domain_weights or {}
    weights = [float(family_weights.get(i.rollout.family, 1.0)) * float(domain_weights.get(i.rollout.domain, 1.0))
               for i in items]
    return None if all(w == 1.0 for w in weights) else weights
