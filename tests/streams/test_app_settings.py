"""The Faust settings the stage runs with (and bench/stream.py's bare reader with it)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rollstream.config import Config, InfraConfig
from rollstream.infra import Endpoints
from streams.advantages import FETCH_BYTES_PER_PARTITION, LeanMonitor, faust_app, rewards_topic


def test_faust_app_settings(tmp_path: Path) -> None:
    config = Config(infra=InfraConfig(state_dir=str(tmp_path), partitions=4))
    app = faust_app("settings-test", config, Endpoints("127.0.0.1:1", "redis://127.0.0.1:6379/0"), str(tmp_path))
    assert app.conf.consumer_max_fetch_size == FETCH_BYTES_PER_PARTITION
    assert app.conf.cython_optimizations is True
    assert isinstance(app.monitor, LeanMonitor)
    assert app.conf.stream_buffer_maxsize >= 2 * config.stream.batch_max


def test_rewards_topic_passes_bytes_through(tmp_path: Path) -> None:
    """Undecodable values must reach the stage as they are, to be dead-lettered."""
    app = faust_app("schema-test", Config(infra=InfraConfig(state_dir=str(tmp_path))),
                    Endpoints("127.0.0.1:1", "redis://127.0.0.1:6379/0"), str(tmp_path))
    schema = rewards_topic(app, "rewards").schema
    for key, value in [(b"g1", b"\xc1 not msgpack"), (None, None)]:
        message = SimpleNamespace(key=key, value=value)
        assert schema.loads_key(app, message) is key  # type: ignore[arg-type]
        assert schema.loads_value(app, message) is value  # type: ignore[arg-type]
