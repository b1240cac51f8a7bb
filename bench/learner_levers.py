"""The learner's engine levers, each measured on its own: seconds per learner step, side by side.

A step is ``Trainer.step`` (forward, loss, backward, clip, AdamW) on SmolLM2-135M, fp32 CPU,
over 2 groups x 8 completions sharing their group's prompt (96 prompt tokens, completions of
64..128 tokens). Variants alternate step by step (A B C ... A B C ...), so a shared machine's
load hits them alike; one warm-up step each first. Per lever, before -> after:

* ``fused_logprob``: the full [B, T, V] log-softmax + gather (the formula before) against the
  fused chunked pass (learner/loss.py ``SampledLogprob``); prefix sharing off on both.
* ``prefix_sharing``: ``learner.prefix_sharing`` false -> true (fused pass on both).
* ``bf16``: ``learner.dtype`` float32 -> bfloat16 (prefix sharing on both);
  ``bf16_logprob_abs_diff``: the sampled tokens' log-probs under bf16 against fp32 (nats).
* ``micro_batch_8_vs_4``: ``learner.micro_batch`` 4 (the quick profile's: a group's prompt
  runs once per micro-batch, so twice) -> 8 (one group, its prompt once), prefix sharing on.
* ``--overlap``: two steps each followed by a publish, the publish awaited against overlapped
  with the next step (``learner.overlap_publish``), alternating.
* ``publish_s``: one publish of the bf16 weights to a Redis weight store (gather, cast, stream),
  when $ROLLSTREAM_BENCH_REDIS (default 127.0.0.1:6379) answers.

    flock /tmp/rollstream-bench.lock python bench/learner_levers.py --reps 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollstream.config import LearnerConfig, OptimConfig
from rollstream.learner import trainer as trainer_module
from rollstream.learner.trainer import Trainer
from rollstream.models import load_model
from rollstream.schemas.events import AdvantagedRollout, Rollout

PROMPT, GROUP, GROUPS = 96, 8, 2


def make_rollouts(vocab: int, seed: int = 0) -> list[AdvantagedRollout]:
    gen = torch.Generator().manual_seed(seed)
    items = []
    for g in range(GROUPS):
        prompt = torch.randint(10, vocab, (PROMPT,), generator=gen).tolist()
        for i in range(GROUP):
            completion = torch.randint(10, vocab, (128 - (i * 9) % 64,), generator=gen).tolist()
            adv = (i - (GROUP - 1) / 2) / GROUP
            items.append(AdvantagedRollout(rollout=Rollout(
                rollout_id=f"g{g}/{i}", group_id=f"g{g}", sample_index=i, group_size=GROUP, task_id="bench",
                family="bench", prompt_token_ids=prompt, completion_token_ids=completion,
                behaviour_logprobs=[-2.0] * len(completion), policy_version_first=0, policy_version_last=0,
                issued_policy_version=0, finish_reason="length"), reward=adv, advantage=adv))
    return items


def log_softmax_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                         temperature: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula before the fused pass: a full [B, T, V] log-softmax kept for backward."""
    logits = logits[:, :-1].float()
    if temperature is not None:
        logits = logits / temperature.clamp_min(1e-6).view(-1, 1, 1).to(logits.dtype)
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    pad = logprobs.new_zeros(logprobs.shape[0], 1)
    return torch.cat([pad, logprobs], dim=1), torch.cat([pad, entropy], dim=1)


@contextmanager
def logprob_formula(fused: bool) -> Iterator[None]:
    original = trainer_module.token_logprobs
    if not fused:
        trainer_module.token_logprobs = log_softmax_logprobs
    try:
        yield
    finally:
        trainer_module.token_logprobs = original


VARIANTS = {  # name: (fused, LearnerConfig overrides)
    "log_softmax": (False, {"prefix_sharing": False}),
    "fused": (True, {"prefix_sharing": False}),
    "fused_prefix": (True, {"prefix_sharing": True}),
    "fused_prefix_bf16": (True, {"prefix_sharing": True, "dtype": "bfloat16"}),
    # the quick profile's micro-batch: a group of 8 in two micro-batches, its prompt run twice
    "fused_prefix_mb4": (True, {"prefix_sharing": True, "micro_batch": 4}),
}


def one_step(model: torch.nn.Module, items: list[AdvantagedRollout], fused: bool, overrides: dict) -> float:
    settings = LearnerConfig(**{"micro_batch": 8, **overrides}, optim=OptimConfig(lr=1e-6, warmup_steps=0))
    trainer = Trainer(model, settings)
    with logprob_formula(fused):
        return trainer.step(items).seconds


@asynccontextmanager
async def scratch_store(figure: str) -> AsyncIterator[tuple[object, object, str] | None]:
    """(Redis client, a weight store under a fresh key prefix, the prefix), or None when Redis does
    not answer (the figure is left out); every key under the prefix is deleted on the way out."""
    from rollstream.redis import connect, delete_prefix
    from rollstream.weights import WeightStore

    client = connect(os.environ.get("ROLLSTREAM_BENCH_REDIS", "redis://127.0.0.1:6379/0"))
    prefix = f"bench:{figure}:{uuid.uuid4().hex[:8]}:"
    try:
        try:
            await client.ping()
        except OSError as exc:
            print(f"no Redis for the {figure} figure: {exc}", file=sys.stderr)
            yield None
            return
        yield client, WeightStore(client, key_prefix=prefix, keep_versions=1, expire_grace_s=0), prefix
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()


async def publish_seconds(model: torch.nn.Module, repeats: int) -> list[float]:
    from rollstream.learner.lora import iter_merged_weights
    from rollstream.learner.publish import iterate_in_thread

    times: list[float] = []
    async with scratch_store("publish") as scratch:
        if scratch is None:
            return times
        _, store, _ = scratch
        for version in range(1, repeats + 1):
            started = time.perf_counter()
            await store.publish_stream(version, iterate_in_thread(lambda: iter_merged_weights(model, torch.bfloat16)),
                                       step=version)
            times.append(time.perf_counter() - started)
    return times


async def publish_overlap(model: torch.nn.Module, items: list[AdvantagedRollout], reps: int) -> dict[str, list[float]]:
    """Seconds of two steps each followed by a publish to Redis (the learner loop's own
    ``publish``), with the publish awaited (``overlap_publish`` false) or overlapped with the next
    step's forward and backward (true); the two alternate, one warm-up pair first."""
    from types import SimpleNamespace

    from rollstream.config import Config, InfraConfig
    from rollstream.learner.train import LearnerLoop, Lineage

    class Announcements:
        async def send(self, *args: object) -> None: ...

    metrics = SimpleNamespace(broadcast_seconds=SimpleNamespace(observe=lambda _: None),
                              publish_peak_extra=SimpleNamespace(set=lambda _: None))
    times: dict[str, list[float]] = {"awaited": [], "overlapped": []}
    async with scratch_store("overlap") as scratch:
        if scratch is None:
            return times
        client, store, prefix = scratch
        for rep in range(reps + 1):
            for mode in times:
                settings = LearnerConfig(micro_batch=8, optim=OptimConfig(lr=1e-6, warmup_steps=0),
                                         overlap_publish=mode == "overlapped")
                trainer = Trainer(model, settings)
                config = Config(infra=InfraConfig(key_prefix=prefix), learner=settings)
                loop = LearnerLoop(config, trainer, None, Lineage(step=0, version=rep * 10), None,  # type: ignore[arg-type]
                                   Announcements(), store, client, metrics, "bench")  # type: ignore[arg-type]
                started = time.perf_counter()
                for _ in range(2):
                    await asyncio.to_thread(trainer.step, items)
                    loop.lineage.version += 1
                    await loop.publisher.publish(overlap=loop.publisher.overlap)
                await loop.publisher.done()
                elapsed = time.perf_counter() - started
                print(f"rep {rep} publish {mode}: {elapsed:.2f} s for 2 steps + 2 publishes", flush=True)
                if rep:
                    times[mode].append(round(elapsed, 3))
    return times


def real_model_gradient_check(model: torch.nn.Module, items: list[AdvantagedRollout]) -> float:
    """|grad(shared) - grad(plain)| / |grad(plain)| of one group's loss on the real model."""
    from rollstream.learner.batch import collate
    from rollstream.learner.trainer import completion_logprobs

    batch = collate(items[:4])
    grads = []
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        logp, _ = completion_logprobs(model, batch, share_prefix=share)
        (logp * batch.loss_mask * batch.advantages.unsqueeze(1)).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    return float((grads[1] - grads[0]).norm() / grads[0].norm())


def bf16_logprob_drift(model: torch.nn.Module, items: list[AdvantagedRollout]) -> dict[str, float]:
    """How far the learner's sampled-token log-probs under bf16 autocast are from fp32 (nats)."""
    from rollstream.learner.batch import collate
    from rollstream.learner.trainer import completion_logprobs

    batch = collate(items[:4])
    with torch.no_grad():
        fp32, _ = completion_logprobs(model, batch)
        bf16, _ = completion_logprobs(model, batch, dtype=torch.bfloat16)
    diff = (fp32 - bf16)[batch.loss_mask.bool()].abs()
    return {"max": round(float(diff.max()), 4), "mean": round(float(diff.mean()), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--overlap", action="store_true", help="only the publish overlap figure")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    items = make_rollouts(model.config.vocab_size)
    if args.overlap:
        load = os.getloadavg()
        times = asyncio.run(publish_overlap(model, items, args.reps))
        result = {"two_steps_and_publishes_s": times, "loadavg": {"before": load, "after": os.getloadavg()},
                  "median_s": {k: statistics.median(v) for k, v in times.items() if v}}
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    names = args.variants.split(",")
    times: dict[str, list[float]] = {n: [] for n in names}
    load = {"before": os.getloadavg()}
    for rep in range(args.reps + 1):  # rep 0: warm-up
        for name in names:
            fused, overrides = VARIANTS[name]
            seconds = one_step(model, items, fused, overrides)
            print(f"rep {rep} {name}: {seconds:.2f} s", flush=True)
            if rep:
                times[name].append(round(seconds, 3))
    load["after"] = os.getloadavg()
    median = {n: statistics.median(t) for n, t in times.items()}
    result = {"step_seconds": times, "median_s": median, "loadavg": load, "threads": args.threads,
              "rollouts": GROUPS * GROUP, "prompt_tokens": PROMPT,
              "completion_tokens": [128 - (i * 9) % 64 for i in range(GROUP)]}
    pairs = {"fused_logprob": ("log_softmax", "fused"), "prefix_sharing": ("fused", "fused_prefix"),
             "bf16": ("fused_prefix", "fused_prefix_bf16"), "all": ("log_softmax", "fused_prefix"),
             "micro_batch_8_vs_4": ("fused_prefix_mb4", "fused_prefix")}
    result["speedup"] = {k: round(median[a] / median[b], 3) for k, (a, b) in pairs.items()
                         if a in median and b in median}
    result["publish_s"] = asyncio.run(publish_seconds(model, 3))
    result["prefix_sharing_grad_rel_diff"] = real_model_gradient_check(model, items)
    result["bf16_logprob_abs_diff"] = bf16_logprob_drift(model, items)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
