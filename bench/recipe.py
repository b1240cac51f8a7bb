"""Runs of the shipped learning recipe (``configs/learning.toml``) through ``rollstream run``, every
stage a process as a user runs it, and the figures read from each run's step log: what
``bench/chains.py`` and ``bench/eval_cost.py`` compare side by side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.vs_trl_probe import idle_check

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "learning.toml"


def run_recipe(name: str, steps: int, args: list[str], work: Path) -> tuple[dict[str, Any], Path]:
    """``rollstream run --config configs/learning.toml --max-steps steps *args`` in ``work`` (its
    state there), after an idle check of the machine. Returns the run's summary (``summarise``
    of the learner's trained steps) and its run directory."""
    argv = [sys.executable, "-m", "rollstream.cli", "run", "--config", str(RECIPE), "--max-steps", str(steps),
            "--set", f"infra.state_dir={work / 'state'}", *args]
    idle = idle_check()
    print(f"[{name}] idle check: {idle['other_busy_cores']} busy cores of others; {' '.join(argv[3:])}", flush=True)
    t0 = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600 + steps * 600, env=env)
    runs = sorted((work / "state" / "runs").glob("*/metrics.jsonl"))
    if proc.returncode != 0 or not runs:
        raise RuntimeError(f"rollstream run {name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    rows = [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()]
    return summarise(name, [r for r in rows if r.get("trained")], idle, round(time.time() - t0, 1)), runs[-1].parent


def summarise(name: str, rows: list[dict[str, Any]], idle: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """A run's learner steps: steps 2..N timed (step 1 carries the model load and the first
    generation's warm-up, the same on every side), seconds per step and per trained token, the
    first and last thirds' seconds per token (a growing backlog shows as a last third slower
    than the first) and what waited in the topics at each step's end."""
    timed = rows[1:]
    seconds = sum(r["step_s"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    third = max(1, len(timed) // 3)

    def per_token(part: list[dict[str, Any]]) -> float | None:
        t = sum(r["tokens"] for r in part)
        return round(sum(r["step_s"] for r in part) / t * 1000, 3) if t else None

    return {
        "name": name, "steps": len(rows), "wall_s": wall_s, "idle": idle,
        "timed_s": round(seconds, 1), "timed_steps": len(timed), "timed_tokens": tokens,
        "s_per_step": round(seconds / len(timed), 2) if timed else None,
        "ms_per_token": round(seconds / tokens * 1000, 3) if tokens else None,
        "ms_per_token_first_third": per_token(timed[:third]),
        "ms_per_token_last_third": per_token(timed[-third:]),
        "step_s": [r["step_s"] for r in rows], "tokens": [r["tokens"] for r in rows],
        "waiting": [sum((r.get("waiting") or {}).values()) for r in rows],
        "stale": sum(r.get("stale") or 0 for r in rows),
        "reward_mean": round(sum(r.get("reward_mean") or 0.0 for r in rows) / max(1, len(rows)), 4),
    }


def pooled(runs: list[dict[str, Any]], per: str) -> float | None:
    """Seconds per ``per`` ("step" or "token") over every run of a side: summed seconds / summed units."""
    units = sum(r["timed_steps" if per == "step" else "timed_tokens"] for r in runs)
    return sum(r["timed_s"] for r in runs) / units if units else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def alternate(sides: tuple[str, ...], rounds: int, run: Callable[[str, str, Path], dict[str, Any]],
              describe: Callable[[dict[str, Any]], str]) -> dict[str, list[dict[str, Any]]]:
    """``run(side, name, work)`` for each side in turn (A B A B), ``rounds`` times, each in a work
    directory of its own (deleted after); prints ``describe(record)`` after each run."""
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for i in range(rounds):
        for side in sides:
            work = Path(tempfile.mkdtemp(prefix=f"rollstream-bench-{side}-"))
            try:
                record = run(side, f"{side}-{i + 1}", work)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results[side].append(record)
            print(f"[{record['name']}] {describe(record)}", flush=True)
    return results
