"""Each group's fate as the learner decides it (pure: no broker, no model)."""

from __future__ import annotations

import time

import pytest

from rollstream.config import Config, RLConfig
from rollstream.kafka import Delivery
from rollstream.learner.batch import select_rollouts
from rollstream.learner.train import LearnerLoop, Lineage
from tests.helpers import group

pytestmark = pytest.mark.unit

def loop(max_staleness: int, lineage: Lineage) -> LearnerLoop:
    config = Config(rl=RLConfig(max_staleness=max_staleness))
    return LearnerLoop(config, None, None, lineage, None, None, None, None, None, "run-1")  # type: ignore[arg-type]


def test_stale_and_trained_groups_get_their_fates_with_versions() -> None:
    groups = [group("fresh", [1.0, -1.0], version=6), group("old", [1.0, -1.0], version=2),
              group("lagging", [1.0, -1.0], version=5)]
    deliveries = [Delivery("advantages", 0, i, g.group_id.encode(), g, time.time()) for i, g in enumerate(groups)]
    selection = select_rollouts(groups, current_version=7, max_staleness=1)
    learner = loop(1, Lineage(step=4, version=8))  # the step ran: 3 -> 4, version 7 -> 8
    fates = {f.group_id: f for f in learner.step_fates(deliveries, selection.lags, 7, stepped=True)}
    assert fates["fresh"].fate == "trained" and fates["fresh"].step == 4 and fates["fresh"].policy_version == 8
    assert fates["fresh"].rollouts_trained == 2 and fates["fresh"].reason == ""
    old = fates["old"]
    assert old.fate == "stale" and old.rollouts_stale == 2 and old.policy_version == 7 and old.learner_version == 7
    assert "policy version(s) [2]" in old.reason and "max_staleness 1" in old.reason
    assert fates["lagging"].fate == "stale" and fates["lagging"].behaviour_versions == [5]
    assert {f.learner_run for f in fates.values()} == {"run-1"}
    assert [f.source_offset for f in fates.values()] == [0, 1, 2]


def test_no_step_means_no_group_trained() -> None:
    groups = [group("a", [1.0, -1.0], version=0)]
    deliveries = [Delivery("advantages", 1, 9, b"a", groups[0], time.time())]
    selection = select_rollouts(groups, current_version=5, max_staleness=1)
    [fate] = loop(1, Lineage(step=2, version=5)).step_fates(deliveries, selection.lags, 5, stepped=False)
    assert fate.fate == "stale" and fate.step == 2 and fate.policy_version == 5 and fate.rollouts_trained == 0


def test_wall_clock_checkpoints_fall_after_each_mark_and_skip_marks_a_long_step_spanned(monkeypatch) -> None:
    from rollstream.config import CheckpointConfig, LearnerConfig
    from rollstream.learner import train

    now = [1000.0]
    monkeypatch.setattr(train.time, "monotonic", lambda: now[0])
    config = Config(learner=LearnerConfig(checkpoint=CheckpointConfig(every=0, every_minutes=1.0)))
    learner = LearnerLoop(config, None, None, Lineage(), None, None, None, None, None, "run-1")  # type: ignore[arg-type]
    due = []
    for t in (1030.0, 1059.0, 1061.0, 1062.0, 1119.0, 1250.0, 1260.0, 1301.0):  # step ends
        now[0] = t
        due.append(learner.timed_due())
    # marks at +60, +120, +180, +240, +300: one checkpoint per mark passed, the step ending at +250
    # spanned the marks at +180 and +240 (one checkpoint, not two), the next falls after +300
    assert due == [False, False, True, False, False, True, False, True]
    off = LearnerLoop(Config(), None, None, Lineage(), None, None, None, None, None, "run-1")  # type: ignore[arg-type]
    now[0] = 10 ** 6
    assert off.timed_due() is False


def test_a_group_resolved_without_rollouts_the_machinery_lost_records_them_on_its_fate() -> None:
    import msgspec

    from rollstream.learner.train import Window
    from rollstream.schemas import ExcludedRollout

    lost = [ExcludedRollout(rollout_id="a/2", sample_index=2, reason="the sandbox was lost under this job")]
    trained = msgspec.structs.replace(group("a", [1.0, -1.0], version=5), excluded=lost)
    deliveries = [Delivery("advantages", 0, 3, b"a", trained, time.time())]
    selection = select_rollouts([trained], current_version=5, max_staleness=1)
    [fate] = loop(1, Lineage(step=1, version=6)).step_fates(deliveries, selection.lags, 5, stepped=True)
    assert fate.fate == "trained" and fate.rollouts_trained == 2 and fate.excluded == lost
    window = Window()
    window.add(trained)
    assert window.summary()["rollouts_excluded"] == 1 and window.summary()["completions"] == 2
