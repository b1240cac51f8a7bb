"""Watching a run: step records, status lines, the summary, the plot, and what waits per topic
(scraped from the stages' real Prometheus endpoints)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client import start_http_server

from rollstream.cli.watch import (
    Watcher,
    moving_average,
    plot,
    read_records,
    scrape,
    summary,
    waiting,
)
from rollstream.infra import free_port
from rollstream.metrics import StageMetrics

pytestmark = pytest.mark.unit

def write_steps(path: Path, n: int, start: float) -> None:
    with open(path, "a") as fh:
        for i in range(n):
            fh.write(json.dumps({"step": i + 1, "policy_version": i + 1, "trained": i != 2, "loss": 0.5 - 0.01 * i,
                                 "rollouts": 16, "stale": 4 if i == 2 else 0, "lag_mean": 0.5, "lag_max": 1,
                                 "groups_resolved": 2, "groups_filtered": i % 2, "completions": 16,
                                 "reward_mean": 0.1 * i, "pass_rate": 0.05 * i, "time": start + 20 * (i + 1)}) + "\n")


def test_records_status_lines_and_summary(tmp_path: Path) -> None:
    start = time.time()
    steps = tmp_path / "steps.jsonl"
    lines: list[str] = []
    watcher = Watcher(steps, tmp_path, max_steps=10, echo=lines.append)
    watcher.started = start
    assert watcher.poll() == []  # no step log yet
    write_steps(steps, 4, start)
    with open(steps, "a") as fh:
        fh.write('{"step": 5, "pol')  # being written: read next time
    records = watcher.poll()
    assert [r["step"] for r in records] == [1, 2, 3, 4] and len(lines) == 4
    assert records[1]["step_s"] == 20 and records[1]["completions_per_s"] == 0.8
    assert records[3]["eta_s"] == round(80 / 3 * 7)  # 3 trained steps in 80 s, 7 to go
    assert "NOT TRAINED" in lines[2] and "dropped 4" in lines[2] and "pass 15%" in lines[3]
    assert read_records(tmp_path) == records  # metrics.jsonl holds exactly what was printed
    table = {line.split("  ")[1].strip(): line.rsplit("  ", 1)[1].strip() for line in summary(records).splitlines()}
    assert table["steps trained"] == "3 of 4" and table["reward mean, first / last quarter"] == "0.000 / 0.300"
    assert table["rollouts dropped as stale"] == "4" and table["groups filtered (nothing to train on)"] == "2"


def test_moving_average_and_plot(tmp_path: Path) -> None:
    assert moving_average([1.0, None, 3.0, 5.0], 2) == [1.0, 1.0, 3.0, 4.0]
    for name in ("a", "b"):
        run = tmp_path / name
        run.mkdir()
        watcher = Watcher(run / "steps.jsonl", run, max_steps=6, echo=lambda line: None)
        write_steps(run / "steps.jsonl", 6, time.time())
        watcher.poll()
    out = plot([tmp_path / "a", tmp_path / "b"], tmp_path / "both.png")
    assert out.read_bytes()[:4] == b"\x89PNG" and out.stat().st_size > 10_000


def test_what_waits_on_each_topic_comes_from_the_stages_metrics() -> None:
    servers = []
    ports = []
    produced = {"sampler": ("out", "prompts", 10), "generator": ("in", "prompts", 7),
                "executor": ("in", "actions", 20)}
    try:
        for stage, (direction, topic, count) in produced.items():
            metrics = StageMetrics(stage)
            (metrics.records_out if direction == "out" else metrics.records_in)(stage, topic).inc(count)
            if stage == "generator":
                metrics.records_out(stage, "actions").inc(28)
            port = free_port()
            servers.append(start_http_server(port, registry=metrics.registry))
            ports.append(port)
        totals = scrape(ports + [free_port()])  # a port that serves nothing is skipped
        assert waiting(totals) == {"prompts": 3, "actions": 8, "rewards": 0, "advantages": 0}
    finally:
        for server, thread in servers:
            server.shutdown()
            thread.join(5)


LEARNER_STUB = """
import json, signal, sys, time
steps = sys.argv[1]
def stop(*_):
    with open(steps, "a") as fh:  # the step it was running, then exit 0 as the learner does
        fh.write(json.dumps({"step": 1, "policy_version": 1, "trained": True, "completions": 16,
                             "reward_mean": 0.5, "pass_rate": 0.25, "time": time.time()}) + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""


def test_max_minutes_stops_the_learner_cleanly_and_summarises(tmp_path: Path, capsys) -> None:
    """`rollstream run --max-minutes`: when the time is up the learner gets SIGTERM (it finishes
    its step, checkpoints, exits 0) and the run ends with its summary and plot, rc 0."""
    import subprocess
    import sys

    from rollstream.cli.run import Child, _supervise
    from rollstream.config_load import load_config

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    config = load_config(None, [f"learner.checkpoint.dir={checkpoints}", "learner.max_steps=500"])
    log = tmp_path / "learner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", LEARNER_STUB, str(checkpoints / "steps.jsonl")],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        assert _supervise(config, [Child("learner", proc, log, free_port())], tmp_path, max_minutes=0.02) == 0
        assert 1.0 <= time.monotonic() - started < 20
        assert proc.returncode == 0
        out = capsys.readouterr().out
        assert "minutes are up" in out and "learner finished 1 steps" in out
        assert "ETA 0 min 00 s" in out  # the time limit caps the ETA (500 steps would take hours)
        assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "reward.png").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_ends_the_run_with_the_summary_of_the_steps_so_far(tmp_path: Path, capsys, monkeypatch) -> None:
    """Ctrl-C while a run is watched: the steps so far are summarised and plotted, rc 130 (the
    caller then stops every child). The SIGINT is sent once the watcher has read the steps."""
    import os
    import signal
    import subprocess
    import sys

    from rollstream.cli import watch
    from rollstream.cli.run import Child, _supervise
    from rollstream.config_load import load_config

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    write_steps(checkpoints / "steps.jsonl", 3, time.time())
    config = load_config(None, [f"learner.checkpoint.dir={checkpoints}", "learner.max_steps=10"])
    poll, pressed = watch.Watcher.poll, []

    def poll_then_ctrl_c(self: watch.Watcher) -> list:
        got = poll(self)
        if not pressed:  # the run is being watched: the user presses Ctrl-C
            pressed.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return got

    monkeypatch.setattr(watch.Watcher, "poll", poll_then_ctrl_c)
    # Python leaves SIGINT ignored when it started so (a background job of a non-interactive shell):
    # Ctrl-C's handler is installed here, as an interactive `rollstream run` has it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert _supervise(config, [Child("learner", proc, tmp_path / "learner.log", free_port())], tmp_path) == 130
        out = capsys.readouterr().out
        assert pressed and "interrupted after 3 steps" in out and "steps trained" in out
        assert (tmp_path / "reward.png").exists()
    finally:
        signal.signal(signal.SIGINT, previous)
        proc.kill()
        proc.wait()