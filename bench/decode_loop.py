"""The decode loop's cache work and lanes, each lever on its own (issue 35), on real SmolLM2.

One torch thread (as ``rollstream run`` gives the generator on 2 cores), the backend's
``DecodeLoop`` driven directly (no broker), each comparison's sides alternating (A B A B):

* **The forward's cost model** that places rows in lanes: decode-forward milliseconds at 1 and
  16 rows, 128 and 2048 columns, fitted as ``fixed + per_row x rows + per_entry x rows x
  columns``. ``split_tokens_fit`` (fixed / per_entry): how many padded cache entries a forward
  is worth, which ``generator.lane_split_tokens`` defaults to.
* ``in_place_churn_gain``: milliseconds per iteration of a loop of ``R`` rows x ``W`` columns in
  which, as in a chains run, one row leaves and another joins (a 64-token prompt) at every
  iteration: transformers' ``DynamicCache`` (every decode step, join and leave makes a new tensor
  of the whole cache) / the loop's in-place cache (a step writes a column, a join writes spare
  rows, a leave moves the last row into the gap).
* ``lanes_gain``: milliseconds per iteration of a loop holding 16 rows of 250-token prompts (fresh
  groups) and 2 rows of 2000-token prompts (a chain's later turns): one lane (``max_lanes = 1``,
  every row padded to 2000) / lanes (the wide rows in a lane of their own, one more forward).
* ``gqa_attention_gain``: the same one padded lane with transformers' sdpa attention (which copies
  the keys and values once per query head whenever a padding mask is given) / the loop's
  (``decode.gqa_attention``: the grouped heads read them in place).

    python bench/decode_loop.py --json bench/results/decode_loop-2026-12-04.json   # ~8 minutes
    python bench/decode_loop.py --quick --json /tmp/decode_loop.json               # ~3 minutes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import report  # noqa: E402


def prompt(seed: int, width: int) -> list[int]:
    return [(seed * 7 + j * 13) % 5000 + 100 for j in range(width)]


def rows_for(widths: list[int], max_new: int, first_seed: int) -> list[Any]:
    from rollstream.consumers.generator.backends.base import GenerationRequest, Sampling
    from rollstream.consumers.generator.backends.decode import new_row

    # rows of one width share their prompt: one prefill (its content does not change what a forward costs)
    return [new_row(GenerationRequest(f"r/{first_seed + i}", prompt(first_seed + w, w),
                                      Sampling(temperature=1.0, max_new_tokens=max_new), seed=first_seed + i),
                    1 << 16, "cpu") for i, w in enumerate(widths)]


def new_loop(model: Any, tokenizer: Any, **options: Any) -> Any:
    from rollstream.consumers.generator.backends.decode import DecodeLoop

    return DecodeLoop(model, tokenizer, eos=set(), context=1 << 16, max_rows=1 << 10, max_kv_tokens=1 << 30,
                      **options)


def forward_ms(model: Any, tokenizer: Any, rows: int, width: int, steps: int = 8) -> float:
    """Median decode-forward ms of one lane of ``rows`` distinct prompts of ``width`` tokens."""
    loop = new_loop(model, tokenizer)
    loop.admit(rows_for([width] * rows, 1000, 0), 0)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        loop.step(0)
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:]) * 1000


def cost_model(model: Any, tokenizer: Any) -> dict[str, float]:
    ms = {(r, w): forward_ms(model, tokenizer, r, w) for r in (1, 16) for w in (128, 2048)}
    per_entry = ((ms[16, 2048] - ms[16, 128]) / 16 + (ms[1, 2048] - ms[1, 128])) / 2 / (2048 - 128)
    per_row = (ms[16, 128] - ms[1, 128]) / 15 - per_entry * 128
    fixed = ms[1, 128] - per_row - per_entry * 128
    return {"forward_ms": {f"{r}x{w}": round(v, 1) for (r, w), v in ms.items()},
            "fixed_ms": round(fixed, 1), "per_row_ms": round(per_row, 2), "per_entry_us": round(per_entry * 1000, 2),
            "split_tokens_fit": round(fixed / per_entry)}


def churn_ms(model: Any, tokenizer: Any, rows: int, width: int, iterations: int, in_place: bool) -> float:
    """Median ms of an iteration (one row leaves, one joins, one forward) of a ``rows x width`` loop."""
    from transformers import DynamicCache

    from rollstream.consumers.generator.backends import decode

    original = decode.growing_cache
    if not in_place:
        decode.growing_cache = lambda config: DynamicCache(config=config)
    try:
        loop = new_loop(model, tokenizer)
        loop.admit(rows_for([width] * rows, 1000, 0), 0)
        loop.step(0)
        times = []
        for i in range(iterations):
            joining = rows_for([64], 1000, 1000 + i)
            loop.rows[i % rows].abandoned = True  # leaves at this step
            started = time.perf_counter()
            loop.admit(joining, 0)
            loop.step(0)
            times.append(time.perf_counter() - started)
        return statistics.median(times[1:]) * 1000
    finally:
        decode.growing_cache = original


def mixed_ms(model: Any, tokenizer: Any, max_lanes: int, steps: int = 8, copies: bool = False) -> tuple[float, int]:
    """Median ms of an iteration of 16 rows of 250-token prompts and 2 of 2000; and the lanes used.
    ``copies``: with transformers' sdpa attention (keys and values copied per query head)."""
    from rollstream.consumers.generator.backends import decode

    loop = new_loop(model, tokenizer, max_lanes=max_lanes)
    if copies:
        model.set_attn_implementation("sdpa")
    loop.admit(rows_for([250] * 16, 1000, 0), 0)
    loop.step(0)
    loop.admit(rows_for([2000], 1000, 100), 0)  # a chain's later turns arrive one at a time
    loop.admit(rows_for([1900], 1000, 101), 0)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        loop.step(0)
        times.append(time.perf_counter() - started)
    decode.gqa_attention(model)  # the loop's attention back
    return statistics.median(times[2:]) * 1000, len(loop.lanes)


def alternate(rounds: int, sides: dict[str, Any]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(rounds):
        for name in (list(sides) if index % 2 == 0 else list(reversed(sides))):
            out[name].append(round(sides[name](), 1))
            print(f"round {index + 1} {name}: {out[name][-1]} ms", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 16 x 600 churn loop, 2 rounds a side (~3 minutes)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each side (default 4; --quick: 2)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    import torch

    from rollstream.models import load_policy

    torch.set_num_threads(1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    model, tokenizer = load_policy("smollm2")
    model.eval()
    rounds = 2 if args.quick else args.rounds
    fit = cost_model(model, tokenizer)
    print(fit, flush=True)
    churn_rows, churn_width = (16, 600) if args.quick else (32, 1200)
    churn = alternate(rounds, {
        "dynamic_cache": lambda: churn_ms(model, tokenizer, churn_rows, churn_width, 6, in_place=False),
        "in_place": lambda: churn_ms(model, tokenizer, churn_rows, churn_width, 6, in_place=True)})
    used = {}

    def mixed(lanes: int) -> float:
        ms, used[lanes] = mixed_ms(model, tokenizer, lanes)
        return ms

    lanes = alternate(rounds, {"one_lane": lambda: mixed(1), "lanes": lambda: mixed(4)})
    gqa = alternate(rounds, {"kv_copied_per_head": lambda: mixed_ms(model, tokenizer, 1, copies=True)[0],
                             "kv_shared": lambda: mixed(1)})
    figures = {
        **{k: v for k, v in fit.items() if k != "forward_ms"},
        f"in_place_churn_gain_{churn_rows}x{churn_width}": round(statistics.median(churn["dynamic_cache"])
                                                                 / statistics.median(churn["in_place"]), 3),
        "lanes_gain_16x250_2x2000": round(statistics.median(lanes["one_lane"]) / statistics.median(lanes["lanes"]), 3),
        "lanes_used": used.get(4),
        "gqa_attention_gain_16x250_2x2000": round(statistics.median(gqa["kv_copied_per_head"])
                                                  / statistics.median(gqa["kv_shared"]), 3),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    report(figures, None)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({**figures, "forward_ms": fit["forward_ms"], "churn_ms": churn,
                                               "mixed_ms": lanes, "gqa_ms": gqa}, indent=2))


if __name__ == "__main__":
    main()
