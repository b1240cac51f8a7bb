"""What the live evaluator costs a run on this machine (issue 34, item 2): the shipped learning
recipe with ``--eval-every N`` against the same recipe without an evaluator, side by side.

Both sides are ``rollstream run --config configs/learning.toml --max-steps S`` played single-turn
(``sampler.max_turns=1``, as docs/learning.md runs it), each in a work directory of its own
(deleted after), after an idle check. The evaluator side adds ``--eval-every N`` with the
evaluator as ``rollstream run`` starts it (one torch thread, ``nice`` 10, a one-container sandbox
pool of its own) and ``eval.final=false``: the whole-split evaluation after the last step is not
a cost to training, so it is left out. Sides alternate (off, on, off, on with ``--rounds 2``).

Figures per run: seconds per learner step and per trained token over steps 2..S (step 1 carries
the model load, the same on both sides), and on the evaluator side what the evaluator reported
(``evals.jsonl``: versions evaluated and skipped, seconds an evaluation). Headline:
``eval_step_cost`` = seconds per step with the evaluator / without (pooled over rounds),
``eval_token_cost`` the same per trained token, ``evals_evaluated`` / ``evals_skipped`` summed
over the evaluator side's runs, ``eval_s_mean`` an evaluation's mean seconds.

    python bench/eval_cost.py --rounds 2 --json bench/results/eval_cost-2026-12-04.json   # 10 steps a run, ~25 min
    python bench/eval_cost.py --quick --json /tmp/eval_cost.json                          # 4 steps a side, ~6 min

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


def evaluations(run_dir: Path) -> dict[str, Any]:
    """What the run's evaluator reported (``evals.jsonl``): live versions evaluated and skipped."""
    from rollstream.evaluator.report import EVALS_FILE

    path = run_dir / "checkpoints" / EVALS_FILE  # beside the learner's steps.jsonl
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    done = [r for r in rows if r.get("status") == "evaluated"]
    return {
        "evaluated": len(done), "skipped": len(rows) - len(done),
        "versions_evaluated": [r.get("version") for r in done],
        "skip_reasons": sorted({str(r.get("reason")) for r in rows if r.get("status") != "evaluated"}),
        "eval_s": [round(float(r.get("duration_s") or 0.0), 1) for r in done],
    }


def run_side(name: str, steps: int, every: int, work: Path, extra: list[str]) -> dict[str, Any]:
    args = ["--set", "sampler.max_turns=1", *[a for s in extra for a in ("--set", s)]]
    if every:
        args += ["--eval-every", str(every), "--set", "eval.final=false"]
    record, run_dir = run_recipe(name, steps, args, work)
    return {**record, **({"evals": evaluations(run_dir)} if every else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="learner steps a run (default 10)")
    parser.add_argument("--every", type=int, default=2, help="the evaluator side's --eval-every (default 2)")
    parser.add_argument("--rounds", type=int, default=1, help="off/on pairs, alternating (default 1)")
    parser.add_argument("--quick", action="store_true", help="4 steps a side, one round (~6 minutes)")
    parser.add_argument("--set", dest="extra", action="append", default=[],
                        help="a config override for both sides (repeatable)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    steps = 4 if args.quick else args.steps
    rounds = 1 if args.quick else args.rounds
    results = alternate(
        ("off", "on"), rounds,
        lambda side, name, work: run_side(name, steps, args.every if side == "on" else 0, work, args.extra),
        lambda r: (f"{r['steps']} steps, {r['s_per_step']} s a step, {r['ms_per_token']} ms a trained token, "
                   f"steps {r['step_s']}" + (f", evals {r['evals']}" if "evals" in r else "")))
    on, off = results["on"], results["off"]
    eval_s = [s for r in on for s in r["evals"]["eval_s"]]
    figures = {
        "eval_step_cost": ratio(pooled(on, "step"), pooled(off, "step")),
        "eval_token_cost": ratio(pooled(on, "token"), pooled(off, "token")),
        "s_per_step_off": round(pooled(off, "step") or 0.0, 2),
        "s_per_step_on": round(pooled(on, "step") or 0.0, 2),
        "evals_evaluated": sum(r["evals"]["evaluated"] for r in on),
        "evals_skipped": sum(r["evals"]["skipped"] for r in on),
        "eval_s_mean": round(sum(eval_s) / len(eval_s), 1) if eval_s else None,
        "steps": steps, "rounds": rounds, "every": args.every,
    }
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "runs": results}, indent=2))
    report(figures, None)


if __name__ == "__main__":
    main()
