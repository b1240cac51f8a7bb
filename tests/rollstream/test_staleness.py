"""The one staleness rule (rollstream.weights.versions_past) at its boundary, and every stage that
reads it agreeing with it: the learner's selection, the executor's episodes, the generator's refusal."""

from __future__ import annotations

import pytest

from rollstream.weights import versions_past


@pytest.mark.unit
@pytest.mark.parametrize(("learner", "oldest", "max_staleness", "past"), [
    (5, 5, 0, 0),   # on-policy: trained at its own version
    (6, 5, 0, 1),   # one step behind with no staleness allowed
    (7, 5, 2, 0),   # lag == max_staleness: still trained
    (8, 5, 2, 1),   # one past it
    (12, 5, 2, 5),
    (3, 5, 2, 0),   # generated with weights newer than the learner's record (a resumed learner)
])
def test_versions_past_is_zero_up_to_max_staleness_inclusive(learner, oldest, max_staleness, past):
    assert versions_past(learner, oldest, max_staleness) == past


@pytest.mark.unit
def test_ahead_counts_the_learner_steps_still_to_come():
    assert versions_past(6, 5, 2) == 0
    assert versions_past(6, 5, 2, ahead=1) == 0
    assert versions_past(7, 5, 2, ahead=1) == 1  # trained one step later at the earliest: past it


@pytest.mark.unit
@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_learner_and_executor_draw_the_line_at_the_same_lag(max_staleness):
    """A rollout the learner still trains is one whose episode the executor lets play on, and the
    reverse, at every lag around the bound."""
    import msgspec

    from rollstream.consumers.executor.episodes import stale_lag
    from rollstream.learner.batch import select_rollouts
    from rollstream.testing import make_action
    from tests.helpers import group

    action = make_action("g", 0)
    action = msgspec.structs.replace(action, rollout=msgspec.structs.replace(action.rollout, policy_version_first=10),
                                     policy_versions=[10])
    for lag in range(max_staleness + 3):
        trained = not select_rollouts([group("g", [1.0, -1.0], version=10)], 10 + lag, max_staleness).stale
        assert trained == (lag <= max_staleness), lag
        assert (stale_lag(action, 10 + lag, max_staleness) is None) == trained, lag
