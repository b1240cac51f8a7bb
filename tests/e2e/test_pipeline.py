"""`rollstream run` end to end: every stage as its own process over the real broker, Redis
and Docker sandboxes, with a tiny random model so it finishes in a few minutes on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.consumers.tiny_model import make_tiny_model_dir


def test_run_trains_and_checkpoints(tmp_path: Path, broker: str, redis_url: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny")
    config = tmp_path / "rollstream.toml"
    config.write_text(f"""
[infra]
kafka_bootstrap = "{broker}"
redis_url = "{redis_url}"
topic_prefix = "e2e{os.getpid()}."
key_prefix = "e2e{os.getpid()}:"
state_dir = "{tmp_path / 'state'}"
partitions = 2

[rl]
group_size = 2
groups_per_step = 2
max_staleness = 1

[generator]
model = "{model}"
max_new_tokens = 24
max_batch_prompts = 2
batch_wait_ms = 10

[executor]
concurrency = 2
pool_size = 1

[stream]
filter_zero_variance = false   # a random model earns the same reward everywhere

[learner]
model = "{model}"
micro_batch = 2
checkpoint_every = 1
""")
    result = subprocess.run(
        [sys.executable, "-m", "rollstream.cli", "run", "--config", str(config), "--max-steps", "2"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "learner finished 2 steps" in output, output[-3000:]
    checkpoints = list((tmp_path / "state" / "runs").glob("*/checkpoints"))
    assert checkpoints, output[-3000:]
    assert any(checkpoints[0].rglob("config.json")), list(checkpoints[0].rglob("*"))
