"""The shipped learning recipe with its subtask chains on against the same recipe played single-turn:
seconds per trained token, side by side in one run (issue 35).

Each side is ``rollstream run --config configs/learning.toml --max-steps N`` on the real model,
every stage a process as a user runs it; the single-turn side adds ``--set sampler.max_turns=1``
(every task one turn, the suite's chains included). Sides alternate (chains, single, chains,
single with ``--rounds 2``), each after an idle check of the machine, each in a work directory
of its own (deleted after). From each run's ``metrics.jsonl`` (a line a learner step):

* ``s_per_token``: the seconds of steps 2..N over the tokens they trained (step 1 carries the
  model load and the first generation's warm-up, the same on both sides, so it is left out);
* ``backlog``: what waited in the topics at each step's end (``waiting``: prompts, actions,
  rewards, advantages), and the first and last thirds' seconds per token: a backlog that grows
  shows as waiting that climbs and a last third slower than the first;
* ``rollouts_by_turn``: the samples generated per turn (a chain's later turns are turn > 1), from
  the run's archive.

Headline: ``chains_token_ratio`` = chains' ``s_per_token`` / single-turn's (each side's seconds
and tokens summed over its rounds); ``chains_backlog_growth`` = the chains side's last third's
seconds per token / its first third's.

    python bench/chains.py --json bench/results/chains-2026-12-04.json     # 20 steps a side, ~40 min
    python bench/chains.py --quick --json /tmp/chains.json                  # 3 steps a side, ~5 min

Needs Docker with the sandbox image, Redis and the model wheel. The last line printed is the
headline; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import report  # noqa: E402
from bench.vs_trl_probe import idle_check  # noqa: E402

RECIPE = REPO / "configs" / "learning.toml"


def run_side(name: str, steps: int, single_turn: bool, work: Path, extra: list[str]) -> dict[str, Any]:
    """One ``rollstream run`` of the recipe; its step log and archive summarised."""
    sets = [*(["--set", "sampler.max_turns=1"] if single_turn else []), *[a for s in extra for a in ("--set", s)]]
    argv = [sys.executable, "-m", "rollstream.cli", "run", "--config", str(RECIPE), "--max-steps", str(steps),
            "--set", f"infra.state_dir={work / 'state'}", *sets]
    idle = idle_check()
    print(f"[{name}] idle check: {idle['other_busy_cores']} busy cores of others; {' '.join(argv[3:])}", flush=True)
    t0 = time.time()
    proc = subprocess.run(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600 + steps * 600, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    runs = sorted((work / "state" / "runs").glob("*/metrics.jsonl"))
    if proc.returncode != 0 or not runs:
        raise RuntimeError(f"rollstream run {name} failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    rows = [json.loads(line) for line in runs[-1].read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("trained")]
    later = summarise_turns(runs[-1].parent / "archive")
    return summarise(name, rows, idle, round(time.time() - t0, 1), later)


def summarise_turns(archive: Path) -> dict[str, int]:
    """Generated samples by turn, from the run's archived ``actions`` (a chain's later turns are turn > 1)."""
    from rollstream.archive import ArchiveStore

    counts: dict[str, int] = {}
    if not archive.exists():
        return counts
    for _, action in ArchiveStore(str(archive)).events("actions"):
        counts[str(action.turn)] = counts.get(str(action.turn), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def summarise(name: str, rows: list[dict[str, Any]], idle: dict[str, Any], wall_s: float,
              turns: dict[str, int]) -> dict[str, Any]:
    timed = rows[1:]
    seconds = sum(r["step_s"] for r in timed)
    tokens = sum(r["tokens"] for r in timed)
    third = max(1, len(timed) // 3)

    def per_token(part: list[dict[str, Any]]) -> float | None:
        t = sum(r["tokens"] for r in part)
        return round(sum(r["step_s"] for r in part) / t * 1000, 3) if t else None

    return {
        "name": name, "steps": len(rows), "wall_s": wall_s, "idle": idle,
        "timed_s": round(seconds, 1), "timed_tokens": tokens,
        "ms_per_token": round(seconds / tokens * 1000, 3) if tokens else None,
        "ms_per_token_first_third": per_token(timed[:third]),
        "ms_per_token_last_third": per_token(timed[-third:]),
        "step_s": [r["step_s"] for r in rows], "tokens": [r["tokens"] for r in rows],
        "waiting": [sum((r.get("waiting") or {}).values()) for r in rows],
        "stale": sum(r.get("stale") or 0 for r in rows),
        "reward_mean": round(sum(r.get("reward_mean") or 0.0 for r in rows) / max(1, len(rows)), 4),
        "rollouts_by_turn": turns,
    }


def side_ratio(chains: list[dict[str, Any]], single: list[dict[str, Any]]) -> float | None:
    def ms(runs: list[dict[str, Any]]) -> float:
        return sum(r["timed_s"] for r in runs) / max(1, sum(r["timed_tokens"] for r in runs))

    return round(ms(chains) / ms(single), 3) if single and chains else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps a run (default 20)")
    parser.add_argument("--rounds", type=int, default=1, help="chains/single pairs, alternating (default 1)")
    parser.add_argument("--quick", action="store_true", help="3 steps a side, one round (~5 minutes)")
    parser.add_argument("--set", dest="extra", action="append", default=[],
                        help="a config override for both sides (repeatable)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    rounds = 1 if args.quick else args.rounds
    results: dict[str, list[dict[str, Any]]] = {"chains": [], "single": []}
    for i in range(rounds):
        for side in ("chains", "single"):
            work = Path(tempfile.mkdtemp(prefix=f"rollstream-chains-{side}-"))
            try:
                record = run_side(f"{side}-{i + 1}", steps, side == "single", work, args.extra)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results[side].append(record)
            print(f"[{record['name']}] {record['steps']} steps, {record['ms_per_token']} ms a trained token "
                  f"(first/last third {record['ms_per_token_first_third']}/{record['ms_per_token_last_third']}), "
                  f"waiting {record['waiting']}, by turn {record['rollouts_by_turn']}", flush=True)
    chains = results["chains"]
    growth = [r["ms_per_token_last_third"] / r["ms_per_token_first_third"] for r in chains
              if r["ms_per_token_first_third"] and r["ms_per_token_last_third"]]
    figures = {
        "chains_token_ratio": side_ratio(chains, results["single"]),
        "chains_ms_per_token": round(sum(r["timed_s"] for r in chains) / max(1, sum(r["timed_tokens"] for r in chains)) * 1000, 3),
        "single_ms_per_token": round(sum(r["timed_s"] for r in results["single"])
                                     / max(1, sum(r["timed_tokens"] for r in results["single"])) * 1000, 3),
        "chains_backlog_growth": round(max(growth), 3) if growth else None,
        "chains_waiting_max": max((max(r["waiting"]) for r in chains), default=None),
        "steps": steps, "rounds": rounds,
    }
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "runs": results}, indent=2))
    report(figures, None)


if __name__ == "__main__":
    main()
