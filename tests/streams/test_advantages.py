"""The stage's own logic in process (no Faust): deadlines, dropped groups, dead letters."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from rollstream.config import Config, InfraConfig, RLConfig, StreamConfig
from rollstream.infra import resolve_endpoints
from rollstream.kafka import RawRecord, ensure_topics, topic_name
from rollstream.redis import key
from rollstream.schemas import DeadLetter, GroupAdvantaged, codec
from rollstream.streams.advantages import open_stream
from rollstream.testing import make_reward
from tests.helpers import read_all, read_counter

pytestmark = pytest.mark.integration
ENCODE = codec(type(make_reward("g", 0, 1.0))).encode


async def test_stage_deadline_emits_partial_drops_small_and_dead_letters_bad_records(
    config: Config, broker: str, infra_config: InfraConfig
):
    config = msgspec.structs.replace(config, rl=RLConfig(group_size=4),
                                     stream=StreamConfig(group_deadline_s=0.5, min_group_size=2))
    await ensure_topics(config.infra, ["rewards", "advantages"])
    rewards = topic_name(config.infra, "rewards")
    events = [make_reward("partial", i, float(i)) for i in range(3)] + [make_reward("lonely", 0, 1.0)]
    records = [RawRecord(rewards, 1, n, e.rollout.group_id.encode(), ENCODE(e)) for n, e in enumerate(events)]
    records.append(RawRecord(rewards, 1, 4, b"x", b"\x01not msgpack"))
    records.append(RawRecord(rewards, 1, 5, b"y", ENCODE(make_reward("bad", 7, 1.0))))  # sample_index >= group_size
    async with open_stream(config, resolve_endpoints(config)) as stage:
        await stage.handle(records)
        await stage.sweep([1])
        assert read_counter(stage.metrics, "stream_groups_emitted", complete="false") == 0  # not yet due
        await asyncio.sleep(0.6)  # past the group deadline (0.5 s): here time itself is the event
        await stage.sweep([0, 2, 3])  # other partitions: not this worker's groups
        assert read_counter(stage.metrics, "stream_groups_emitted", complete="false") == 0
        await stage.sweep([1])
        assert read_counter(stage.metrics, "stream_groups_emitted", complete="false") == 1
        assert read_counter(stage.metrics, "stream_groups_dropped", reason="incomplete") == 1
        await stage.handle([RawRecord(rewards, 1, 6, b"lonely", ENCODE(make_reward("lonely", 1, 0.0)))])  # too late
        assert read_counter(stage.metrics, "stream_rewards_late") == 1
        dropped = await stage.store.client.smembers(key(infra_config, "progress:groups_dropped"))
        assert dropped == {b"lonely"}
    out = await read_all(broker, topic_name(config.infra, "advantages"), expect=1, idle_s=0.5)
    event = codec(GroupAdvantaged).decode(out[0][2])
    assert len(out) == 1 and event.group_id == "partial" and not event.complete and event.stats.size == 3
    letters = await read_all(broker, topic_name(config.infra, "rewards.dlq"), expect=2, idle_s=0.5)
    dead = sorted((d.offset, d.value, d.reason) for d in (codec(DeadLetter).decode(v) for _, _, v in letters))
    assert [(offset, value) for offset, value, _ in dead] == [(4, records[4].value), (5, records[5].value)]
    assert "sample_index 7 >= group_size 4" in dead[1][2]
