"""Each group's fate as the learner decides it and records it in the ledger (no broker, no model;
one test against the real Redis for the progress counts)."""

from __future__ import annotations

import time

import pytest

from rollstream.config import Config
from rollstream.kafka import Delivery
from rollstream.learner.batch import select_rollouts
from rollstream.learner.ledger import Decision, Ledger, Window, step_decisions
from rollstream.learner.metrics import LearnerMetrics
from rollstream.learner.train import LearnerLoop, Lineage
from rollstream.metrics import StageMetrics
from rollstream.schemas import GroupFate
from rollstream.schemas.events import group_outcome
from tests.helpers import group


def ledger(lineage: Lineage) -> Ledger:
    return Ledger(Config(), lineage, None, None, None, None, "run-1")  # type: ignore[arg-type]


def step_fates(deliveries: list[Delivery], lags: list[int], version: int, lineage: Lineage, *, stepped: bool,
               bound: int = 1) -> list[GroupFate]:
    decisions = step_decisions(deliveries, lags, version, lineage.version if stepped else None, bound)
    return [ledger(lineage).fate(d, version) for d in decisions]


@pytest.mark.unit
def test_stale_and_trained_groups_get_their_fates_with_versions() -> None:
    groups = [group("fresh", [1.0, -1.0], version=6), group("old", [1.0, -1.0], version=2),
              group("lagging", [1.0, -1.0], version=5)]
    deliveries = [Delivery("advantages", 0, i, g.group_id.encode(), g, time.time()) for i, g in enumerate(groups)]
    selection = select_rollouts(groups, current_version=7, max_staleness=1)
    lineage = Lineage(step=4, version=8)  # the step ran: 3 -> 4, version 7 -> 8
    fates = {f.group_id: f for f in step_fates(deliveries, selection.lags, 7, lineage, stepped=True)}
    assert fates["fresh"].fate == "trained" and fates["fresh"].step == 4 and fates["fresh"].policy_version == 8
    assert fates["fresh"].rollouts_trained == 2 and fates["fresh"].reason == ""
    old = fates["old"]
    assert old.fate == "stale" and old.rollouts_stale == 2 and old.policy_version == 7 and old.learner_version == 7
    assert "policy version(s) [2]" in old.reason and "max_staleness 1" in old.reason
    assert fates["lagging"].fate == "stale" and fates["lagging"].behaviour_versions == [5]
    assert {f.learner_run for f in fates.values()} == {"run-1"}
    assert [f.source_offset for f in fates.values()] == [0, 1, 2]


@pytest.mark.unit
def test_no_step_means_no_group_trained() -> None:
    groups = [group("a", [1.0, -1.0], version=0)]
    deliveries = [Delivery("advantages", 1, 9, b"a", groups[0], time.time())]
    selection = select_rollouts(groups, current_version=5, max_staleness=1)
    [fate] = step_fates(deliveries, selection.lags, 5, Lineage(step=2, version=5), stepped=False)
    assert fate.fate == "stale" and fate.step == 2 and fate.policy_version == 5 and fate.rollouts_trained == 0


@pytest.mark.unit
def test_wall_clock_checkpoints_fall_after_each_mark_and_skip_marks_a_long_step_spanned(monkeypatch) -> None:
    from rollstream.config import CheckpointConfig, LearnerConfig
    from rollstream.learner import checkpointer

    now = [1000.0]
    monkeypatch.setattr(checkpointer.time, "monotonic", lambda: now[0])
    config = Config(learner=LearnerConfig(checkpoint=CheckpointConfig(every=0, every_minutes=1.0)))
    learner = LearnerLoop(config, None, None, Lineage(), None, None, None, None, None, "run-1")  # type: ignore[arg-type]
    due = []
    for t in (1030.0, 1059.0, 1061.0, 1062.0, 1119.0, 1250.0, 1260.0, 1301.0):  # step ends
        now[0] = t
        due.append(learner.checkpointer.timed_due())
    # marks at +60, +120, +180, +240, +300: one checkpoint per mark passed, the step ending at +250
    # spanned the marks at +180 and +240 (one checkpoint, not two), the next falls after +300
    assert due == [False, False, True, False, False, True, False, True]
    off = LearnerLoop(Config(), None, None, Lineage(), None, None, None, None, None, "run-1")  # type: ignore[arg-type]
    now[0] = 10 ** 6
    assert off.checkpointer.timed_due() is False


@pytest.mark.unit
def test_a_group_resolved_without_rollouts_the_machinery_lost_records_them_on_its_fate() -> None:
    import msgspec

    from rollstream.schemas import ExcludedRollout

    lost = [ExcludedRollout(rollout_id="a/2", sample_index=2, reason="the sandbox was lost under this job")]
    trained = msgspec.structs.replace(group("a", [1.0, -1.0], version=5), excluded=lost)
    deliveries = [Delivery("advantages", 0, 3, b"a", trained, time.time())]
    selection = select_rollouts([trained], current_version=5, max_staleness=1)
    [fate] = step_fates(deliveries, selection.lags, 5, Lineage(step=1, version=6), stepped=True)
    assert fate.fate == "trained" and fate.rollouts_trained == 2 and fate.excluded == lost
    window = Window()
    window.add(trained)
    assert window.summary()["rollouts_excluded"] == 1 and window.summary()["completions"] == 2


@pytest.mark.unit
def test_every_fate_maps_to_one_outcome_of_the_vocabulary() -> None:
    from typing import get_args

    from rollstream.schemas.events import DropReason, GroupFateKind, GroupOutcome

    seen = {fate: group_outcome(fate) for fate in get_args(GroupFateKind)}
    assert seen == {"trained": ("trained", ""), "filtered": ("filtered", ""), "stale": ("dropped", "stale"),
                    "duplicate": ("dropped", "duplicate"), "invalid": ("dropped", "invalid")}
    assert {o for o, _ in seen.values()} == set(get_args(GroupOutcome))
    assert {r for _, r in seen.values() if r} < set(get_args(DropReason))  # + the stream's "incomplete"


class _Recorder:
    """The producer and consumer a ledger writes to, recording the order of what it does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def send_many(self, records: list[tuple[str, GroupFate]]) -> None:
        self.calls += [("fate", f"{f.group_id}:{f.fate}") for _, f in records]

    async def dead_letter(self, delivery: Delivery, reason: str, stage: str) -> None:
        self.calls.append(("dead_letter", delivery.event.group_id))

    def done(self, delivery: Delivery) -> None:
        self.calls.append(("done", delivery.event.group_id))


@pytest.mark.integration
async def test_the_ledger_records_fates_before_offsets_and_counts_in_one_vocabulary(infra_config) -> None:
    """Trained, stale, filtered, duplicate and invalid groups: the fates are sent before any offset
    is marked done, the invalid one is dead-lettered, the duplicate is not consumed twice, and
    Redis's progress (what `rollstream run` prints) and the metric say trained / filtered /
    dropped by reason, with the stream's incomplete groups among the dropped."""
    from rollstream.redis import connect, mark_group_dropped, progress

    names = ["t", "s", "f", "d", "i"]
    deliveries = [Delivery("advantages", 0, n, name.encode(), group(name, [1.0, -1.0]), time.time())
                  for n, name in enumerate(names)]
    kinds = ["trained", "stale", "filtered", "duplicate", "invalid"]
    decisions = [Decision(d, kind, "" if kind == "trained" else f"because {kind}") for d, kind in zip(deliveries, kinds)]
    recorder, lineage = _Recorder(), Lineage(step=3, version=3, groups_consumed=10)
    metrics = LearnerMetrics(StageMetrics("learner"))
    redis = connect(infra_config.redis_url)
    try:
        book = Ledger(Config(infra=infra_config), lineage, recorder, recorder, redis, metrics,  # type: ignore[arg-type]
                      "run-1")
        await book.decide(decisions, learner_version=2)
        await mark_group_dropped(redis, infra_config, "x")  # the stream drops an incomplete group
        counts = await progress(redis, infra_config)
    finally:
        await redis.aclose()
    first_done = next(i for i, (what, _) in enumerate(recorder.calls) if what == "done")
    assert all(what != "fate" for what, _ in recorder.calls[first_done:]), recorder.calls
    assert [c for c in recorder.calls if c[0] == "dead_letter"] == [("dead_letter", "i")]
    assert lineage.groups_consumed == 14 and "d" not in lineage.recent and "i" in lineage.recent
    assert counts == {"issued": 0, "trained": 1, "filtered": 1, "version": 0,
                      "dropped": {"duplicate": 1, "incomplete": 1, "invalid": 1, "stale": 1}}
    sample = metrics.stage.registry.get_sample_value
    assert sample("rollstream_learner_groups_total", {"outcome": "dropped", "reason": "stale"}) == 1
    assert sample("rollstream_learner_groups_total", {"outcome": "filtered", "reason": ""}) == 1
    assert book.window.groups == 3  # the policy's figures: trained, stale and filtered (not a copy, not invalid)
