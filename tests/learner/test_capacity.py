"""The learner releases the sampler's capacity for a step's groups only once the version that
trained them is published (against the real broker and Redis).

Released earlier, the sampler issues the next groups at once and an idle generator samples them
with the old weights, which the learner then drops as stale: in a 9-step run of SmolLM2 with
max_staleness 1 that was 8 of 26 groups, every third pair.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from rollstream.config import CheckpointConfig, Config, LearnerConfig, OptimConfig, RLConfig
from rollstream.kafka import EventProducer, ensure_topics
from rollstream.learner import ledger, publish, train
from rollstream.schemas import GroupAdvantaged
from tests.helpers import group

pytestmark = pytest.mark.integration

PER_STEP = 2


@pytest.mark.parametrize(("broadcast_every", "steps"), [(1, 3), (2, 4)])
async def test_capacity_follows_publication(config: Config, learner_model_dir: str, tmp_path, monkeypatch,
                                            broadcast_every: int, steps: int) -> None:
    config = msgspec.structs.replace(
        config,
        rl=RLConfig(groups_per_step=PER_STEP, max_staleness=100, seed=1),  # made at v0: never stale here
        learner=LearnerConfig(model=learner_model_dir, micro_batch=4, optim=OptimConfig(lr=1e-3),
                              checkpoint=CheckpointConfig(every=0, dir=str(tmp_path / "ckpt")),
                              broadcast_every=broadcast_every, max_steps=steps),
    )
    await ensure_topics(config.infra, ["advantages", "policy", "fates"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("advantages", group(f"g{i}", [1.0, -1.0], seed=i)) for i in range(steps * PER_STEP)])

    events: list[tuple[str, int]] = []
    set_consumed, set_version = train.set_groups_consumed, train.set_learner_version

    async def released(client, infra, count: int) -> None:
        events.append(("released", count))
        await set_consumed(client, infra, count)

    async def published(client, infra, version: int) -> None:
        events.append(("published", version))
        await set_version(client, infra, version)

    monkeypatch.setattr(train, "set_groups_consumed", released)
    monkeypatch.setattr(ledger, "set_groups_consumed", released)  # the ledger's release
    monkeypatch.setattr(train, "set_learner_version", published)  # a lineage's first version
    monkeypatch.setattr(publish, "set_learner_version", published)  # every publish
    await asyncio.wait_for(train.run(config), 300)

    version = 0
    for kind, value in events:
        if kind == "published":
            version = value
        else:  # every group released was trained into a version already published
            assert value <= version * PER_STEP, str(events)
    assert ("published", steps) in events and events[-1] == ("released", steps * PER_STEP), events
    if broadcast_every == 2:  # after step 1 (not published) nothing of it was released
        assert ("released", PER_STEP) not in events, events


async def test_filtered_groups_are_recorded_and_counted_not_trained(config: Config, learner_model_dir: str,
                                                                   tmp_path, monkeypatch) -> None:
    """The stream emits groups with nothing to train on flagged ``filtered``: the learner counts
    them into the next step's record (reward, pass rate) and frees their capacity at once, and
    no step is filled or trained with them."""
    config = msgspec.structs.replace(
        config,
        # One partition: the groups arrive in the order sent, so the extra ones (the poison group,
        # the redelivered copy of g0) are read before the last step and every group gets its fate.
        infra=msgspec.structs.replace(config.infra, partitions=1),
        rl=RLConfig(groups_per_step=PER_STEP, max_staleness=100, seed=1),
        learner=LearnerConfig(model=learner_model_dir, micro_batch=4, optim=OptimConfig(lr=1e-3),
                              checkpoint=CheckpointConfig(every=0, dir=str(tmp_path / "ckpt")), max_steps=2),
    )
    flat = [msgspec.structs.replace(group(f"flat{i}", [0.5, 0.5], seed=i), filtered="zero_variance") for i in range(3)]
    useful = [group(f"g{i}", [1.0, -1.0], seed=i) for i in range(4)]
    # Schema-valid, but a token id outside the model's vocabulary: it would crash the forward pass.
    poison = group("poison", [1.0, -1.0], seed=9)
    bad_rollout = msgspec.structs.replace(poison.rollouts[1].rollout, completion_token_ids=[5, 2**31 - 1],
                                          behaviour_logprobs=[-1.0, -1.0])
    poison = msgspec.structs.replace(poison, rollouts=[poison.rollouts[0],
                                                       msgspec.structs.replace(poison.rollouts[1], rollout=bad_rollout)])
    await ensure_topics(config.infra, ["advantages", "policy", "fates"])
    async with EventProducer(config.infra, client_id="test") as producer:
        await producer.send_many([("advantages", g) for g in (flat[0], useful[0], flat[1], poison, useful[1], flat[2],
                                                               useful[2], useful[0], useful[3])])
    released: list[int] = []
    set_consumed = train.set_groups_consumed

    async def record(client, infra, count: int) -> None:
        released.append(count)
        await set_consumed(client, infra, count)

    monkeypatch.setattr(train, "set_groups_consumed", record)
    monkeypatch.setattr(ledger, "set_groups_consumed", record)
    await asyncio.wait_for(train.run(config), 300)

    from rollstream.learner.checkpoint import read_step_log

    steps = read_step_log(tmp_path / "ckpt")
    assert [s["trained"] for s in steps] == [True, True]
    trained = [g for s in steps for g in s["groups"]]  # arrival order across partitions may vary
    assert sorted(trained) == ["g0", "g1", "g2", "g3"]  # no step holds a filtered group
    assert sum(s["groups_filtered"] for s in steps) == 3 and sum(s["groups_resolved"] for s in steps) == 7
    assert steps[0]["reward_mean"] is not None and released[-1] == 8  # the poison group is resolved too
    # Each group's fate on the record: trained at its step, filtered with the stream's reason, the
    # redelivered copy of g0 (the same partition, so after the first) as a duplicate.
    from rollstream.schemas import GroupFate
    from tests.helpers import read_events

    fates = await read_events(config.infra, "fates", GroupFate, lambda got: len(got) >= 9)
    assert len(fates) == 9
    [invalid] = [f for f in fates if f.fate == "invalid"]
    assert invalid.group_id == "poison" and "outside the model's vocabulary" in invalid.reason
    from rollstream.schemas import codec
    from tests.helpers import read_dead_letters

    [letter] = await read_dead_letters(config.infra, "advantages", 1)
    assert letter.stage == "learner" and letter.value == codec(GroupAdvantaged).encode(poison)
    step_of = {g: s["step"] for s in steps for g in s["groups"]}
    assert {f.group_id: f.step for f in fates if f.fate == "trained"} == step_of
    assert {f.group_id: f.reason for f in fates if f.fate == "filtered"} == {f"flat{i}": "zero_variance"
                                                                             for i in range(3)}
    [dup] = [f for f in fates if f.fate == "duplicate"]
    assert dup.group_id == "g0" and dup.source_offset > next(f.source_offset for f in fates
                                                              if f.group_id == "g0" and f.fate == "trained")
    trained = [f for f in fates if f.fate == "trained"]
    assert all(f.policy_version == f.learner_version + 1 and f.rollouts_trained == f.rollouts == 2 for f in trained)
