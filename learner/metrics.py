"""Prometheus metrics of the learner (on the stage's own registry, prefix ``rollstream_learner_``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rollstream.metrics import StageMetrics

if TYPE_CHECKING:
    from rollstream.schemas import GroupAdvantaged

STEP_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
STALENESS_BUCKETS = (-1, 0, 1, 2, 3, 4, 6, 8, 12, 16, 32)
DEVICE_FIGURES = ("device_memory_allocated_bytes", "device_memory_peak_bytes", "device_memory_reserved_bytes",
                  "device_utilization_percent", "device_temperature_celsius")
STAT_GAUGES = ("clip_frac_low", "clip_frac_high", "is_mean", "is_max", "is_trunc_frac", "kl", "entropy")


class LearnerMetrics:
    def __init__(self, stage: StageMetrics) -> None:
        self.stage = stage
        self.loss = stage.gauge("learner_loss", "Loss of the last optimizer step")
        self.stats = {name: stage.gauge(f"learner_{name}", f"{name} of the last step (token mean; is_max: max)")
                      for name in STAT_GAUGES}
        self.grad_norm = stage.gauge("learner_grad_norm", "Gradient norm before clipping, last step")
        self.tokens_per_s = stage.gauge("learner_tokens_per_second", "Trained tokens per second, last step")
        self.lr = stage.gauge("learner_lr", "Learning rate of the last step")
        self.policy_version = stage.gauge("learner_policy_version", "Policy version (steps of this lineage)")
        self.step_seconds = stage.histogram("learner_step_seconds", "Wall time of one optimizer step", STEP_BUCKETS)
        self.broadcast_seconds = stage.histogram("learner_broadcast_seconds", "Publish of one weight version",
                                                 STEP_BUCKETS)
        self.staleness = stage.histogram("learner_rollout_staleness", "Learner version minus the rollout's "
                                         "policy_version_first, every rollout consumed", STALENESS_BUCKETS)
        self.steps = stage.counter("learner_steps", "Optimizer steps taken")
        self.domain_scale = stage.gauge(
            "learner_domain_advantage_scale", "learner.domain_normalize: the factor each domain's advantages "
            "were multiplied by in the last step that trained it (1 / their std)", ("domain",))
        self.tokens = stage.counter("learner_tokens", "Generated tokens trained on")
        self.rollouts = stage.counter("learner_rollouts", "Rollouts consumed, by outcome", ("outcome",))
        self.groups = stage.counter("learner_groups", "Groups consumed, by outcome (trained, filtered, dropped) and "
                                    "a drop's reason (stale, duplicate, invalid)", ("outcome", "reason"))
        self.checkpoints = stage.counter("learner_checkpoints", "Checkpoints written")
        # Several ranks (learner/distributed.py): each rank's own figures, by rank.
        self.ranks = stage.gauge("learner_ranks", "Ranks training the policy")
        self.rank_step_seconds = stage.histogram("learner_rank_step_seconds", "Wall time of one step on each rank",
                                                 STEP_BUCKETS, ("rank",))
        self.rank_allreduce_seconds = stage.histogram(
            "learner_rank_allreduce_seconds", "Time of one step's gradient all-reduce (DDP, timed by its comm hook) "
            "and of the wait for the step's figures of every rank (all modes; FSDP's reduce-scatters overlap the "
            "backward and are in the step time), on each rank", STEP_BUCKETS, ("rank",))
        self.device = {name: stage.gauge(f"learner_{name}", f"CUDA {name.replace('_', ' ')} after the last step, by rank",
                                         ("rank",))
                       for name in DEVICE_FIGURES}
        self.publish_peak_extra = stage.gauge("learner_publish_peak_extra_bytes", "Resident memory the last "
                                              "weight publish added to the publishing rank at its peak")
        # Per task family, every rollout of every group the learner resolves (trained, stale or
        # filtered): the reward and pass rate of the policy, as the step records have them. Rewards
        # can be negative, so their sum is two counters (a histogram with negative buckets has no
        # _sum, and a sum that falls breaks rate()): mean = (positive - negative) / rollouts.
        self.family_rollouts = stage.counter(
            "learner_family_rollouts", "Resolved rollouts by task family and whether they passed every test "
            "(unknown: written before it was recorded)", ("family", "passed"))
        self.family_reward_positive = stage.counter(
            "learner_family_reward_positive", "Sum of the positive rewards of resolved rollouts, by task "
            "family", ("family",))
        self.family_reward_negative = stage.counter(
            "learner_family_reward_negative", "Sum of the magnitudes of the negative rewards of resolved "
            "rollouts, by task family", ("family",))
        # Per family means are these sums over learner_family_rollouts_total.
        self.family_turns = stage.counter(
            "learner_family_turns", "Sum of the turns resolved rollouts took (multi-turn episodes), by task family",
            ("family",))
        self.family_staleness = stage.counter(
            "learner_family_staleness", "Sum of the staleness (learner version - policy_version_first) of "
            "resolved rollouts, by task family", ("family",))

    def observe_step(self, loss: float, grad_norm: float, tokens: int, seconds: float, lr: float,
                     stats: dict[str, float], version: int) -> None:
        self.loss.set(loss)
        self.grad_norm.set(grad_norm)
        self.tokens_per_s.set(tokens / seconds if seconds > 0 else 0.0)
        self.lr.set(lr)
        self.policy_version.set(version)
        self.step_seconds.observe(seconds)
        self.steps.inc()
        self.tokens.inc(tokens)
        for name, gauge in self.stats.items():
            gauge.set(stats.get(name, 0.0))

    def observe_domain_scales(self, scales: Mapping[str, float]) -> None:
        for domain, scale in scales.items():
            self.domain_scale.labels(domain or "unrecorded").set(scale)

    def observe_ranks(self, ranks: list[dict[str, float]]) -> None:
        """Each rank's figures of the last step (learner/distributed.py ``RANK_FIGURES``)."""
        self.ranks.set(len(ranks))
        for rank, figures in enumerate(ranks):
            label = str(rank)
            if "step_seconds" in figures:
                self.rank_step_seconds.labels(label).observe(figures["step_seconds"])
            if "allreduce_seconds" in figures:
                self.rank_allreduce_seconds.labels(label).observe(figures["allreduce_seconds"])
            for name, gauge in self.device.items():
                if name in figures:
                    gauge.labels(label).set(figures[name])

    def observe_rollouts(self, lags: Iterable[int], trained: int, stale: int, empty: int) -> None:
        for lag in lags:
            self.staleness.observe(lag)
        self.rollouts.labels("trained").inc(trained)
        self.rollouts.labels("stale").inc(stale)
        self.rollouts.labels("empty").inc(empty)

    def observe_group(self, group: GroupAdvantaged, version: int | None = None) -> None:
        """A resolved group's rewards, passes, turns and (given the learner's ``version``) staleness,
        by its task family."""
        family = group.family
        self.family_turns.labels(family).inc(sum(turns_of(item.rollout.generated_mask) for item in group.rollouts))
        if version is not None:
            self.family_staleness.labels(family).inc(
                sum(max(0, version - item.rollout.policy_version_first) for item in group.rollouts))
        positive = sum(item.reward for item in group.rollouts if item.reward > 0)
        negative = -sum(item.reward for item in group.rollouts if item.reward < 0)
        self.family_reward_positive.labels(family).inc(positive)
        self.family_reward_negative.labels(family).inc(negative)
        for item in group.rollouts:
            passed = "unknown" if item.passed is None else "true" if item.passed else "false"
            self.family_rollouts.labels(family, passed).inc()


def turns_of(mask: object) -> int:
    """The model's turns in a rollout: runs of generated tokens in its mask (no mask: one turn)."""
    if mask is None:
        return 1
    turns, previous = 0, 0
    for bit in mask:  # type: ignore[attr-defined]
        if bit and not previous:
            turns += 1
        previous = bit
    return max(turns, 1)
