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
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import report  # noqa: E402
from bench.recipe import alternate, pooled, ratio, run_recipe  # noqa: E402


def run_side(name: str, steps: int, single_turn: bool, work: Path, extra: list[str]) -> dict[str, Any]:
    """One ``rollstream run`` of the recipe; its step log and archive summarised."""
    sets = [*(["sampler.max_turns=1"] if single_turn else []), *extra]
    record, run_dir = run_recipe(name, steps, [a for s in sets for a in ("--set", s)], work)
    return {**record, "rollouts_by_turn": summarise_turns(run_dir / "archive"),
            "groups": summarise_groups(run_dir / "archive")}


def summarise_turns(archive: Path) -> dict[str, int]:
    """Generated samples by turn, from the run's archived ``actions`` (a chain's later turns are turn > 1)."""
    from rollstream.archive import ArchiveStore

    counts: dict[str, int] = {}
    if not archive.exists():
        return counts
    for _, action in ArchiveStore(str(archive)).events("actions"):
        counts[str(action.turn)] = counts.get(str(action.turn), 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def summarise_groups(archive: Path) -> dict[str, Any]:
    """Where a run's time went, group by group, from its archive: each group's latency (issued to
    decided by the learner), its turns and its fate, split into episodes of one turn and of
    several; and how many groups of each kind were in flight on average (a long episode holds one
    of the sampler's slots, ``(max_staleness + 1) x groups_per_step``, until its last turn ends)."""
    from rollstream.archive import ArchiveStore

    if not archive.exists():
        return {}
    store = ArchiveStore(str(archive))
    issued = {e.group_id: e for _, e in store.events("prompts") if e.continuation is None}
    turns: dict[str, int] = {}
    for _, action in store.events("actions"):
        gid = action.rollout.group_id
        turns[gid] = max(turns.get(gid, 0), action.turn)
    fates = {e.group_id: e for _, e in store.events("fates")}
    kinds: dict[str, dict[str, Any]] = {}
    spans = []
    for gid, prompt in issued.items():
        fate = fates.get(gid)
        if fate is None:
            continue  # still in flight when the run stopped
        kind = "multi_turn" if prompt.max_turns > 1 else "single_turn"
        latency = fate.decided_at - prompt.issued_at
        spans.append((prompt.issued_at, fate.decided_at, kind))
        k = kinds.setdefault(kind, {"groups": 0, "latency_s": [], "turns": [], "fates": {}})
        k["groups"] += 1
        k["latency_s"].append(round(latency, 1))
        k["turns"].append(turns.get(gid, 1))
        k["fates"][fate.fate] = k["fates"].get(fate.fate, 0) + 1
    if spans:
        start, end = min(s[0] for s in spans), max(s[1] for s in spans)
        for kind, k in kinds.items():
            busy = sum(b - a for a, b, kd in spans if kd == kind)
            k["mean_in_flight"] = round(busy / max(1e-9, end - start), 2)
            k["latency_s_mean"] = round(sum(k["latency_s"]) / len(k["latency_s"]), 1)
    return kinds


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
    results = alternate(
        ("chains", "single"), rounds,
        lambda side, name, work: run_side(name, steps, side == "single", work, args.extra),
        lambda r: (f"{r['steps']} steps, {r['ms_per_token']} ms a trained token (first/last third "
                   f"{r['ms_per_token_first_third']}/{r['ms_per_token_last_third']}), waiting {r['waiting']}, "
                   f"by turn {r['rollouts_by_turn']}, groups {r['groups']}"))
    chains = results["chains"]
    growth = [r["ms_per_token_last_third"] / r["ms_per_token_first_third"] for r in chains
              if r["ms_per_token_first_third"] and r["ms_per_token_last_third"]]
    figures = {
        "chains_token_ratio": ratio(pooled(chains, "token"), pooled(results["single"], "token")),
        "chains_ms_per_token": round((pooled(chains, "token") or 0.0) * 1000, 3),
        "single_ms_per_token": round((pooled(results["single"], "token") or 0.0) * 1000, 3),
        "chains_backlog_growth": round(max(growth), 3) if growth else None,
        "chains_waiting_max": max((max(r["waiting"]) for r in chains), default=None),
        "steps": steps, "rounds": rounds,
    }
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "runs": results}, indent=2))
    report(figures, None)


if __name__ == "__main__":
    main()
