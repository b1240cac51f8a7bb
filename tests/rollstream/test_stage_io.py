"""A stage's plumbing opened from its spec (rollstream/stage_io.py), against the real broker and Redis."""

from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from rollstream.config import Config, InfraConfig
from rollstream.kafka import bootstrap_of, topic_name
from rollstream.schemas.stages import SPECS, consumer_group
from rollstream.stage_io import open_stage

pytestmark = pytest.mark.integration


async def _topics(infra: InfraConfig) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_of(infra))
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_stage_opens_the_topics_group_and_clients_its_spec_names(infra_config: InfraConfig) -> None:
    config = Config(infra=infra_config)
    async with open_stage(config, "executor", client_id="executor-test", guard=True, max_poll_records=7) as io:
        assert io.spec is SPECS["executor"]
        assert io.consumer is not None and io.consumer.topic == topic_name(infra_config, "actions")
        assert io.consumer.group_id == consumer_group(infra_config.topic_prefix, "executor")
        assert io.guard is not None and await io.redis.ping()
        topics = await _topics(infra_config)
        for name in ("actions", "rewards", "audit", "prompts", "actions.dlq"):
            assert topic_name(infra_config, name) in topics, name
    async with open_stage(config, "sampler", client_id="sampler-test", extra_topics=("advantages",)) as io:
        assert io.consumer is None and io.guard is None  # the sampler consumes nothing in a stage group
        assert topic_name(infra_config, "advantages") in await _topics(infra_config)
