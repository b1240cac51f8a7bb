"""What recomputing the KV cache at an in-flight weight swap would cost (issue 35, item 2).

With ``generator.update = "in_flight"`` the rows in progress continue under the new weights. Their
prefix's KV cache was computed by the old weights: it can be kept (what the decode loop does; each
token's log-prob is still that of the distribution it was drawn from) or recomputed, one prefill
over every live row's prompt and tokens so far with the new weights. This measures the second on
real SmolLM2 (one torch thread, as ``rollstream run`` gives the generator on 2 cores) for loop
states a run reaches (rows x prefix tokens), against one decode forward of the same loop.

Figures per shape: ``recompute_s`` (best of 3 prefills of distinct rows), ``decode_forward_s``
(median of 12), ``forwards_equivalent`` (recompute / forward: the decode steps a swap would cost).
Headline: ``recompute_forwards_median`` over the shapes, and ``recompute_s_16x250`` (16 rows of 250
tokens: the learning recipe's loop at a swap). Beside it, what one decode forward costs by rows at 1
and 2 torch threads (``forward_ms``, 110 prompt tokens): what a chain's later turns, decoded a few
rows at a time, can gain from more cores (``two_thread_gain_2_rows``, ``two_thread_gain_32_rows``). And what growing the cache in place gains over transformers'
``DynamicCache`` (a new tensor of the cache's size per layer and step) for a wide loop (32 rows of
1200 tokens, a multi-turn loop's width): ``growing_cache_gain_32x1200`` (decode forward ms,
DynamicCache / the loop's growing cache).

    python bench/kv_recompute.py --json bench/results/kv_recompute-2026-12-04.json   # ~8 minutes
    python bench/kv_recompute.py --quick --json /tmp/kv.json                          # ~3 minutes
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import report  # noqa: E402

SHAPES = ((8, 150), (16, 250), (32, 250), (32, 350))


def distinct_prompts(rows: int, width: int) -> list[list[int]]:
    return [[(i * 7 + j) % 5000 + 100 for j in range(width)] for i in range(rows)]


def decode_seconds(model: Any, prefilled: tuple[Any, Any, Any, Any], steps: int, skip: int) -> float:
    """Median seconds of a decode forward over ``steps`` steps from a prefill (the first ``skip`` left out)."""
    import torch

    cache, logits, mask, pos = prefilled
    rows, tokens, times = logits.shape[0], logits.argmax(-1), []
    with torch.inference_mode():
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones((rows, 1))], 1)
            pos = pos + 1
            started = time.perf_counter()
            logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos[:, None],
                           past_key_values=cache, use_cache=True).logits[:, -1, :]
            times.append(time.perf_counter() - started)
            tokens = logits.argmax(-1)
    return statistics.median(times[skip:])


def prefilled(model: Any, prompts: list[list[int]], share: bool = False) -> tuple[Any, Any, Any, Any]:
    import torch

    from rollstream.consumers.generator.backends import decode

    with torch.inference_mode():
        return decode.prefill(model, prompts, 0, share=share)


def measure(model: Any, rows: int, width: int) -> dict[str, Any]:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        state = prefilled(model, distinct_prompts(rows, width))
        times.append(time.perf_counter() - started)
    recompute, forward = min(times), decode_seconds(model, state, 12, 0)
    return {"rows": rows, "prefix_tokens": width, "recompute_s": round(recompute, 3),
            "decode_forward_s": round(forward, 4), "forwards_equivalent": round(recompute / forward, 1)}


def forward_ms(model: Any, rows: int, threads: int, width: int = 110) -> float:
    """Median milliseconds of a decode forward of ``rows`` rows past a ``width``-token prompt."""
    import torch

    torch.set_num_threads(threads)
    prompt = [(j * 13) % 5000 + 100 for j in range(width)]
    return round(decode_seconds(model, prefilled(model, [prompt] * rows, share=True), 40, 5) * 1000, 1)


def cache_gain(model: Any, rows: int, width: int) -> dict[str, float]:
    """Median decode-forward ms with transformers' DynamicCache and with the loop's growing cache."""
    from transformers import DynamicCache

    from rollstream.consumers.generator.backends import decode

    out = {}
    original = decode.growing_cache
    for name, factory in (("dynamic", lambda config: DynamicCache(config=config)), ("growing", original)):
        decode.growing_cache = factory
        try:
            out[f"{name}_ms"] = round(decode_seconds(model, prefilled(model, distinct_prompts(rows, width)), 25, 3)
                                      * 1000, 1)
        finally:
            decode.growing_cache = original
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two shapes, a 16 x 600 wide loop (~3 minutes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()
    import torch

    from rollstream.models import load_model

    torch.set_num_threads(args.threads)
    model = load_model("smollm2")
    model.eval()
    shapes = SHAPES[:2] if args.quick else SHAPES
    results = []
    for rows, width in shapes:
        results.append(measure(model, rows, width))
        print(results[-1], flush=True)
    wide = (16, 600) if args.quick else (32, 1200)  # the full size's prefills alone take minutes
    growth = cache_gain(model, *wide)
    print({f"cache_{wide[0]}x{wide[1]}": growth}, flush=True)
    forwards = {f"{threads}_threads": {str(rows): forward_ms(model, rows, threads) for rows in (2, 8, 32)}
                for threads in (1, 2)}
    torch.set_num_threads(args.threads)
    print({"forward_ms": forwards}, flush=True)
    figures = {
        f"growing_cache_gain_{wide[0]}x{wide[1]}": round(growth["dynamic_ms"] / growth["growing_ms"], 3),
        "two_thread_gain_2_rows": round(forwards["1_threads"]["2"] / forwards["2_threads"]["2"], 3),
        "two_thread_gain_32_rows": round(forwards["1_threads"]["32"] / forwards["2_threads"]["32"], 3),
        "recompute_forwards_median": statistics.median(r["forwards_equivalent"] for r in results),
        "recompute_s_16x250": next((r["recompute_s"] for r in results if (r["rows"], r["prefix_tokens"]) == (16, 250)),
                                   None),
        "threads": args.threads,
    }
    report(figures, None)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({**figures, "shapes": results, "forward_ms": forwards,
                                               f"cache_{wide[0]}x{wide[1]}": growth}, indent=2))


if __name__ == "__main__":
    main()
