"""`rollstream infra up|status|down` starts, reports and stops only its own processes."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rollstream import infra
from rollstream.config import Config, InfraConfig
from rollstream.infra import free_port, pid_alive, port_open


@pytest.mark.integration
def test_up_is_idempotent_and_down_stops_only_ours(tmp_path: Path) -> None:
    dead_redis = free_port()
    config = InfraConfig(
        state_dir=str(tmp_path / "state"),
        broker_port=free_port(),
        redis_url=f"redis://127.0.0.1:{dead_redis}/0",  # nothing answers: infra starts its own
        redis_port=free_port(),
    )
    first = infra.up(config)
    try:
        pids = {name: rec["pid"] for name, rec in first["processes"].items()}
        assert set(pids) == {"broker", "redis"}
        assert first["kafka_bootstrap"] == f"127.0.0.1:{config.broker_port}"
        assert first["redis_url"] == f"redis://127.0.0.1:{config.redis_port}/0"
        report = infra.status(config)
        assert report["kafka_healthy"] and report["redis_healthy"]
        resolved = infra.with_local_endpoints(Config(infra=config)).infra  # what the CLI passes on
        assert (resolved.kafka_bootstrap, resolved.redis_url) == (first["kafka_bootstrap"], first["redis_url"])

        second = infra.up(config)  # idempotent: same processes
        assert {n: r["pid"] for n, r in second["processes"].items()} == pids
    finally:
        stopped = infra.down(config)
    assert sorted(stopped) == ["broker", "redis"]
    assert not any(pid_alive(pid) for pid in pids.values())
    assert not port_open("127.0.0.1", config.broker_port)
    assert infra.down(config) == []  # nothing left to stop


@pytest.mark.integration
def test_existing_redis_is_used_not_started(tmp_path: Path, redis_url: str) -> None:
    config = InfraConfig(state_dir=str(tmp_path / "s"), broker_port=free_port(), redis_url=redis_url)
    state = infra.up(config)
    try:
        assert "redis" not in state["processes"]
        assert state["redis_url"] == redis_url
    finally:
        infra.down(config)


@pytest.mark.unit
def test_missing_infrastructure_is_a_clear_error(tmp_path: Path) -> None:

    from rollstream.errors import ConfigError

    with pytest.raises(ConfigError, match="rollstream infra up"):
        infra.with_local_endpoints(Config(infra=InfraConfig(state_dir=str(tmp_path / "none"))))
    with pytest.raises(ConfigError, match="infra.kafka_bootstrap is not set"):  # a stage never guesses
        infra.resolve_endpoints(InfraConfig(state_dir=str(tmp_path / "none")))


@pytest.mark.unit
def test_configured_endpoints_are_never_replaced(tmp_path: Path) -> None:
    """A configured broker and Redis are used as they are, whatever a state file says."""
    config = Config(infra=InfraConfig(state_dir=str(tmp_path / "s"), kafka_bootstrap="kafka:9092",
                                      redis_url="redis://redis:6379/0"))
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "infra.json").write_text('{"kafka_bootstrap": "127.0.0.1:1", "redis_url": "redis://x:1/0"}')
    assert infra.with_local_endpoints(config) == config
    assert infra.resolve_endpoints(config) == infra.Endpoints("kafka:9092", "redis://redis:6379/0")


@pytest.mark.unit
def test_state_file_is_json(tmp_path: Path) -> None:
    config = InfraConfig(state_dir=str(tmp_path / "s"), broker_port=free_port())
    infra.up(config)
    try:
        state = msgspec.json.decode((tmp_path / "s" / "infra.json").read_bytes())
        assert state["processes"]["broker"]["pid"] > 0
    finally:
        infra.down(config)
