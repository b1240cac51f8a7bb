"""One learner configuration's step time, peak memory and publish memory, on 1 rank or under torchrun
(bench/learner.py runs it side by side on 1 and 2 ranks; it is not a benchmark by itself).

Every rank builds the model (``--model``: a model spec, or ``random:300m`` / ``random:135m``, a
Llama of that size with random weights), wraps it as the learner does (learner/distributed.py:
``--parallel ddp`` or ``fsdp``; one rank: none), and takes ``--steps`` steps of the learner's
Trainer on the same batch (the first a warm-up; the step plan split by tokens, as rank 0 sends it).
Then rank 0 publishes the weights as the learner does (gathered one tensor at a time, streamed
to a weight store in Redis) and measures the resident memory the publish adds. Rank 0 writes:
``step_seconds`` (median of the timed steps), ``peak_rss_gb`` (VmHWM of every rank before the
publish), ``publish_extra_gb``, ``params``.

``[torchrun --nproc-per-node 2 bench/learner_ranks.py ...|python bench/learner_ranks.py ...] --json OUT``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollstream.config import LearnerConfig, OptimConfig
from rollstream.learner.batch import plan_step
from rollstream.learner.distributed import bound_heap, init_ranks, parallelize, shutdown
from rollstream.learner.publish import PeakRSS, iterate_in_thread
from rollstream.learner.trainer import Trainer
from rollstream.schemas.events import AdvantagedRollout, Rollout

SIZES = {  # hidden, layers, intermediate, heads (SmolLM2's vocabulary of 49152, tied embeddings)
    "135m": (576, 30, 1536, 9),
    "300m": (1024, 24, 2816, 16),
}


def build_model(spec: str) -> torch.nn.Module:
    if not spec.startswith("random:"):
        from rollstream.models import load_model

        return load_model(spec)
    from transformers import AutoModelForCausalLM, LlamaConfig

    hidden, layers, intermediate, heads = SIZES[spec.split(":", 1)[1]]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate,
                         num_attention_heads=heads, num_key_value_heads=heads // 3 if heads % 3 == 0 else heads // 4,
                         max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=0)
    return AutoModelForCausalLM.from_config(config)


def batch(rollouts: int, prompt: int, completion: int, vocab: int) -> list[AdvantagedRollout]:
    gen = torch.Generator().manual_seed(0)
    items = []
    for i in range(rollouts):
        ids = torch.randint(10, vocab, (prompt + completion,), generator=gen).tolist()
        adv = (i - (rollouts - 1) / 2) / rollouts
        items.append(AdvantagedRollout(rollout=Rollout(
            rollout_id=f"b/{i}", group_id="b", sample_index=i, group_size=rollouts, task_id="bench", family="bench",
            prompt_token_ids=ids[:prompt], completion_token_ids=ids[prompt:], behaviour_logprobs=[-2.0] * completion,
            policy_version_first=0, policy_version_last=0, issued_policy_version=0, finish_reason="length"),
            reward=adv, advantage=adv))
    return items


def vm_hwm_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def publish(trainer: Trainer, redis_url: str) -> float:
    """Rank 0: stream the weights (bf16) to a Redis weight store; the RSS the publish added, GB."""
    from rollstream.redis import connect, delete_prefix
    from rollstream.weights import WeightStore

    prefix = f"bench:ranks:{uuid.uuid4().hex[:8]}:"
    client = connect(redis_url)
    try:
        store = WeightStore(client, key_prefix=prefix, keep_versions=1, expire_grace_s=0)
        with PeakRSS() as peak:
            await store.publish_stream(1, iterate_in_thread(lambda: trainer.named_weights(torch.bfloat16)), step=1)
        return peak.extra_bytes / 1e9
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()


def side(nproc: int, work: Path, name: str, *options: str, timeout_s: float = 900) -> dict:
    """Run this script on ``nproc`` ranks (torchrun for more than one) and read its figures."""
    import os
    import subprocess

    out = work / f"{name}.json"
    script = str(Path(__file__).resolve())
    launch = [sys.executable, script] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", script]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([*launch, *options, "--json", str(out)], cwd=root, capture_output=True, text=True,
                          timeout=timeout_s, env=dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def rank_figures(quick: bool, redis_url: str, work: Path) -> dict:
    """dp_step_ratio, fsdp_rss_ratio (>= 300M parameters; and 135M) and publish_peak_extra_gb,
    each side run after the other (bench/learner.py's docstring says what each compares)."""
    steps = "2" if quick else "4"
    dp = ["--model", "random:135m", "--parallel", "ddp", "--rollouts", "8", "--prompt", "64", "--completion", "64",
          "--steps", steps]
    one = side(1, work, "dp-1x2", *dp, "--threads", "2")
    two = side(2, work, "dp-2x1", *dp, "--threads", "1")
    figures = {"dp_step_ratio": round(one["step_seconds"] / two["step_seconds"], 3),
               "dp_step_seconds_1x2": round(one["step_seconds"], 2), "dp_step_seconds_2x1": round(two["step_seconds"], 2),
               "dp_allreduce_seconds": round(statistics.median(two["allreduce_seconds"][1:] or two["allreduce_seconds"]), 2)}
    for size in ("300m", "135m"):
        rss = ["--model", f"random:{size}", "--parallel", "fsdp", "--rollouts", "4", "--prompt", "32",
               "--completion", "32", "--steps", "1", "--redis", redis_url]  # AdamW's state exists after one
        single = side(1, work, f"rss-{size}-1", *rss)
        sharded = side(2, work, f"rss-{size}-2", *rss)
        suffix = "" if size == "300m" else f"_{size}"
        figures[f"fsdp_rss_ratio{suffix}"] = round(max(sharded["peak_rss_gb"]) / single["peak_rss_gb"][0], 3)
        figures[f"fsdp_params{suffix}"] = sharded["params"]
        figures[f"rss_gb_1rank{suffix}"] = round(single["peak_rss_gb"][0], 2)
        figures[f"rss_gb_fsdp_ranks{suffix}"] = [round(x, 2) for x in sharded["peak_rss_gb"]]
        if size == "300m":
            figures["publish_peak_extra_gb"] = round(sharded["publish_extra_gb"], 3)
            figures["publish_peak_extra_gb_1rank"] = round(single["publish_extra_gb"], 3)
            figures["publish_bf16_gb"] = round(sharded["params"] * 2 / 1e9, 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="random:300m")
    parser.add_argument("--parallel", default="fsdp", choices=["ddp", "fsdp"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="steps, the first a warm-up")
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--redis", default="", help="publish to a weight store in this Redis (empty: no publish)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = LearnerConfig(parallel=args.parallel, micro_batch=args.micro_batch, optim=OptimConfig(lr=1e-6))
    ranks = init_ranks(settings)
    bound_heap()  # what the learner's ranks do (init_ranks), here on one rank as well: the same allocator
    model = build_model(args.model)
    params = sum(p.numel() for p in model.parameters())
    model.train()
    runner = model
    if ranks is not None:
        model, runner, _ = parallelize(model, ranks, args.parallel, None)
    trainer = Trainer(model, settings, pad_id=0, runner=runner, ranks=ranks)
    items = batch(args.rollouts, args.prompt, args.completion, 49152)
    world, rank = (ranks.world, ranks.rank) if ranks is not None else (1, 0)
    times, allreduce = [], []
    for _ in range(args.steps):
        started = time.perf_counter()
        result = trainer.train(plan_step(items, 1, args.micro_batch, world), rank)
        times.append(time.perf_counter() - started)
        allreduce.append(max(r["allreduce_seconds"] for r in result.ranks) if result.ranks else 0.0)
    peak = torch.tensor([float(vm_hwm_bytes())], dtype=torch.float64)
    peaks = [peak]
    if ranks is not None:
        import torch.distributed as dist

        peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(peaks, peak, group=ranks.control)
    extra = None
    if args.redis:
        if rank == 0:
            extra = asyncio.run(publish(trainer, args.redis))
        else:
            for _ in trainer.named_weights(torch.bfloat16):
                pass  # the gathers need every rank
    if rank == 0:
        Path(args.json).write_text(json.dumps({
            "ranks": world, "threads": args.threads, "params": params, "steps_seconds": times,
            "step_seconds": statistics.median(times[1:] or times), "allreduce_seconds": allreduce,
            "peak_rss_gb": [float(p[0]) / 1e9 for p in peaks], "publish_extra_gb": extra}))
    shutdown(ranks)


if __name__ == "__main__":
    main()
