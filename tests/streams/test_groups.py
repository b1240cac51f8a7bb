"""The Redis open-group store and the group decisions, against the real Redis."""

from __future__ import annotations

import time

import pytest

from rollstream.config import InfraConfig, StreamConfig
from rollstream.redis import connect, groups_resolved, key
from rollstream.schemas import GroupAdvantaged, codec
from rollstream.streams.groups import Arrival, Finished, GroupStore, LoadedGroup, Outcome, decide
from rollstream.testing import make_reward

ENCODE = codec(type(make_reward("g", 0, 1.0))).encode


def arrival(group_id: str, index: int, reward: float, *, size: int = 4, partition: int = 0,
            deadline: float | None = None, task_id: str = "task-0") -> Arrival:
    event = make_reward(group_id, index, reward, group_size=size, task_id=task_id)
    return Arrival(group_id, event.rollout.rollout_id, size, partition,
                   deadline if deadline is not None else time.time() + 600, ENCODE(event))


@pytest.fixture
async def store(infra_config: InfraConfig):
    client = connect(infra_config.redis_url)
    try:
        yield GroupStore(client, infra_config, done_ttl_s=3600)
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_add_detects_complete_groups_and_ignores_duplicate_rollouts(store: GroupStore):
    first = await store.add([arrival("g1", 0, 1.0), arrival("g1", 1, 0.0), arrival("g2", 0, 1.0)])
    assert first.ready == [] and first.duplicates == 0
    second = await store.add([arrival("g1", 1, 0.5), arrival("g1", 2, 0.0), arrival("g1", 3, 1.0)])
    assert [(g.group_id, g.partition) for g in second.ready] == [("g1", 0)]
    assert second.duplicates == 1  # g1/1 again: the first one stays
    assert sorted(second.ready[0].rollouts) == ["g1/0", "g1/1", "g1/2", "g1/3"]
    stored = codec(type(make_reward("g", 0, 1.0))).decode(second.ready[0].rollouts["g1/1"])
    assert stored.reward == 0.0
    loaded = await store.load([("g1", 0), ("g2", 0)])
    assert [len(g.rollouts) for g in loaded] == [4, 1]


@pytest.mark.integration
async def test_full_cycle_marks_done_and_later_rewards_are_late(store: GroupStore, infra_config: InfraConfig):
    result = await store.add([arrival("g", i, float(i)) for i in range(4)])
    assert [g.group_id for g in result.ready] == ["g"]
    outcomes = decide(result.ready, {}, StreamConfig(), 4, now=123.0)
    assert outcomes["g"].kind == "emitted" and outcomes["g"].complete
    staged = await store.stage(outcomes, {"g": 3})
    assert staged["g"].first and staged["g"].watermark == -1  # no output offset known yet
    await store.finish([Finished("g", 0, staged["g"].outcome.kind, 3, 41)])
    assert await store.client.get(store.key("outpos", 3)) == b"41"
    # nothing of the group is left open; a replayed reward is late, not a new group
    assert await store.due([0], time.time() + 10_000) == []
    again = await store.add([arrival("g", 0, 0.0)])
    assert (again.ready, again.late) == ([], 1)
    assert await store.client.exists(store.key("g", "g")) == 0
    assert await store.load([("g", 0)]) == []  # done: nothing to load
    assert await groups_resolved(store.client, infra_config) == 0  # emitted: not counted as dropped


@pytest.mark.integration
async def test_staged_outcome_is_kept_across_retries(store: GroupStore):
    await store.add([arrival("g", i, float(i % 2)) for i in range(4)])
    loaded = await store.load([("g", 0)])
    await store.client.set(store.key("outpos", 1), 17)  # highest acked output offset so far
    first = await store.stage(decide(loaded, {}, StreamConfig(), 4, now=1.0), {"g": 1})
    await store.client.set(store.key("outpos", 1), 30)  # other groups were produced since
    # a second attempt (e.g. after a crash) that computed other bytes (later time) gets the first
    second = await store.stage(decide(loaded, {}, StreamConfig(), 4, now=2.0), {"g": 1})
    assert second["g"].outcome.value == first["g"].outcome.value
    assert (first["g"].first, second["g"].first) == (True, False)
    assert first["g"].watermark == second["g"].watermark == 17  # fixed when first staged
    assert codec(GroupAdvantaged).decode(first["g"].outcome.value).emitted_at == 1.0
    # and a reload hands back the staged outcome instead of the rollouts
    reloaded = await store.load([("g", 0)])
    assert reloaded[0].staged == first["g"].outcome and reloaded[0].rollouts == {}
    assert reloaded[0].watermark == 17
    assert decide(reloaded, {}, StreamConfig(), 4) == {"g": first["g"].outcome}


@pytest.mark.integration
async def test_deadline_emits_partial_groups_or_drops_them(store: GroupStore, infra_config: InfraConfig):
    past = time.time() - 1
    await store.add([arrival("big", 0, 1.0, deadline=past), arrival("big", 1, 0.0, deadline=past),
                     arrival("small", 0, 1.0, partition=1, deadline=past),
                     arrival("open", 0, 1.0, deadline=time.time() + 600)])
    due = await store.due([0, 1], time.time())
    assert sorted((d.group_id, d.partition, d.expired) for d in due) == [("big", 0, True), ("small", 1, True)]
    assert await store.due([2], time.time()) == []  # another worker's partition
    loaded = await store.load([(d.group_id, d.partition) for d in due])
    outcomes = decide(loaded, {d.group_id: d.expired for d in due}, StreamConfig(min_group_size=2), 4)
    assert outcomes["big"].kind == "emitted" and not outcomes["big"].complete
    assert outcomes["small"] == Outcome(kind="dropped", reason="incomplete", complete=False)
    event = codec(GroupAdvantaged).decode(outcomes["big"].value)
    assert (event.stats.size, event.stats.expected_size, event.complete) == (2, 4, False)
    staged = await store.stage(outcomes, {"big": 0})
    await store.finish([Finished(gid, {"big": 0, "small": 1}[gid], s.outcome.kind) for gid, s in staged.items()])
    dropped = await store.client.smembers(key(infra_config, "progress:groups_dropped"))
    assert dropped == {b"small"}
    assert await groups_resolved(store.client, infra_config) == 1


def loaded_group(group_id: str, rewards: list[float], *, size: int | None = None, task_id: str = "t") -> LoadedGroup:
    size = size or len(rewards)
    events = [make_reward(group_id, i, r, group_size=size, task_id=task_id) for i, r in enumerate(rewards)]
    return LoadedGroup(group_id, 0, rollouts={e.rollout.rollout_id: ENCODE(e) for e in events})


@pytest.mark.unit
def test_decide_filters_zero_variance_and_computes_advantages_in_sample_order():
    groups = [loaded_group("flat", [1.0, 1.0, 1.0]), loaded_group("mixed", [0.0, 1.0, 1.0]),
              loaded_group("waiting", [1.0], size=3)]
    outcomes = decide(groups, {}, StreamConfig(estimator="rloo"), 3)
    # emitted for the record, flagged: the learner counts it and trains on it no step
    assert (outcomes["flat"].kind, outcomes["flat"].reason) == ("emitted", "zero_variance")
    flat = codec(GroupAdvantaged).decode(outcomes["flat"].value)
    assert flat.filtered == "zero_variance" and [r.advantage for r in flat.rollouts] == [0.0, 0.0, 0.0]
    assert all(r.passed for r in flat.rollouts)  # the rewards' records said: ran, every test passed
    assert "waiting" not in outcomes  # neither complete nor expired: stays open
    event = codec(GroupAdvantaged).decode(outcomes["mixed"].value)
    assert [r.rollout.sample_index for r in event.rollouts] == [0, 1, 2]
    assert [r.advantage for r in event.rollouts] == pytest.approx([-1.0, 0.5, 0.5])
    assert event.estimator == "rloo" and event.complete
    assert event.stats.reward_mean == pytest.approx(2 / 3)


@pytest.mark.unit
def test_decide_keeps_zero_variance_groups_when_not_filtering():
    outcomes = decide([loaded_group("flat", [1.0, 1.0])], {}, StreamConfig(filter_zero_variance=False), 2)
    event = codec(GroupAdvantaged).decode(outcomes["flat"].value)
    assert [r.advantage for r in event.rollouts] == [0.0, 0.0] and event.filtered == ""


@pytest.mark.unit
def test_decide_clips_rewards_but_reports_them_as_scored():
    outcomes = decide([loaded_group("g", [-5.0, 0.0, 5.0])], {}, StreamConfig(estimator="dr_grpo", reward_clip=1.0), 3)
    event = codec(GroupAdvantaged).decode(outcomes["g"].value)
    assert [r.reward for r in event.rollouts] == [-5.0, 0.0, 5.0]
    assert [r.advantage for r in event.rollouts] == pytest.approx([-1.0, 0.0, 1.0])


@pytest.mark.unit
def test_decide_batch_normalisation_uses_only_emitted_groups():
    groups = [loaded_group("a", [0.0, 1.0]), loaded_group("b", [0.0, 0.0, 2.0, 2.0]), loaded_group("flat", [3.0, 3.0])]
    outcomes = decide(groups, {}, StreamConfig(normalize="batch", std_eps=1e-12), 2)
    std = (29 / 30) ** 0.5  # pooled [0, 1, 0, 0, 2, 2]; the filtered group is left out
    a = codec(GroupAdvantaged).decode(outcomes["a"].value)
    assert [r.advantage for r in a.rollouts] == pytest.approx([-0.5 / std, 0.5 / std])
    assert codec(GroupAdvantaged).decode(outcomes["flat"].value).filtered == "zero_variance"



def with_infra(group_id: str, rewards: list[float | None]) -> LoadedGroup:
    """A group whose ``None`` entries are rollouts the machinery lost (outcome infra)."""
    import msgspec

    from rollstream.schemas import ExecutionRecord

    lost = ExecutionRecord(sandbox_id="", exit_code=None, duration_s=0.0, error_kind="infra",
                           error_message="the sandbox was lost under this job 3 time(s)")
    events = []
    for i, reward in enumerate(rewards):
        event = make_reward(group_id, i, 0.0 if reward is None else reward, group_size=len(rewards))
        if reward is None:
            event = msgspec.structs.replace(event, components={}, execution=lost, outcome="infra")
        events.append(event)
    return LoadedGroup(group_id, 0, rollouts={e.rollout.rollout_id: ENCODE(e) for e in events})


@pytest.mark.unit
def test_decide_resolves_a_group_without_its_infra_rollouts():
    """An infra outcome is no reward: it completes the group but is left out of the advantages
    (they are the group's without it), and the group lists it with why."""
    outcomes = decide([with_infra("g", [0.0, None, 1.0, 1.0]), loaded_group("plain", [0.0, 1.0, 1.0])], {},
                      StreamConfig(), 4)
    event = codec(GroupAdvantaged).decode(outcomes["g"].value)
    plain = codec(GroupAdvantaged).decode(outcomes["plain"].value)
    assert event.complete and not event.filtered and outcomes["g"].excluded == 1
    assert [r.rollout.sample_index for r in event.rollouts] == [0, 2, 3]
    assert [r.advantage for r in event.rollouts] == pytest.approx([r.advantage for r in plain.rollouts])
    assert [(x.rollout_id, x.sample_index, x.outcome) for x in event.excluded] == [("g/1", 1, "infra")]
    assert "lost" in event.excluded[0].reason
    assert (event.stats.size, event.stats.expected_size) == (3, 4)


@pytest.mark.unit
def test_decide_filters_a_group_with_too_few_rollouts_left_and_keeps_the_others_verdicts():
    outcomes = decide([with_infra("few", [None, 1.0, None]), with_infra("none", [None, None]),
                       with_infra("flat", [1.0, None, 1.0])], {}, StreamConfig(min_group_size=2), 3)
    few = codec(GroupAdvantaged).decode(outcomes["few"].value)
    assert (outcomes["few"].kind, outcomes["few"].reason) == ("emitted", "infra")
    assert few.filtered == "infra" and [r.advantage for r in few.rollouts] == [0.0] and len(few.excluded) == 2
    empty = codec(GroupAdvantaged).decode(outcomes["none"].value)
    assert empty.rollouts == [] and empty.filtered == "infra" and empty.task_id and len(empty.excluded) == 2
    flat = codec(GroupAdvantaged).decode(outcomes["flat"].value)  # two left, equal: zero variance as before
    assert flat.filtered == "zero_variance" and len(flat.excluded) == 1
