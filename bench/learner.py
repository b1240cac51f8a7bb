"""Learner throughput, broadcast throughput and memory, measured side by side in one run.

* ``step_ratio``: trained tokens/s of the learner stage (``learner.train.run``, consuming
  ``advantages`` from a real broker, Redis for its progress keys) divided by a bare torch loop
  (forward, log-softmax gather, -(A * logp) token mean, backward, clip, AdamW) on the same
  micro-batches of the same model. One stage step and one bare step alternate, so the load of a
  shared machine hits both alike; a stage step is timed from producing its groups to its
  step-log line. The first step of each is a warm-up. The stage runs with ``broadcast_every``
  and ``checkpoint_every`` out of the way (the broadcast is measured below). Target >= 0.9.
* ``broadcast_ratio``: bytes/s from the learner's publish (bf16 cast of the weights +
  ``WeightStore.publish``) to the weights loaded in a generator (``WeightStore.fetch`` +
  ``load_state_dict`` into a plain bf16 model), SmolLM2-135M, divided by raw redis-py pipelined
  SET + GET of the same bytes in the same chunk size. Best of the repeats. Target >= 0.6.
* ``peak_rss_gb``: peak RSS of a separate learner stage process that loads the model (from a
  Hugging Face directory) and takes one step at micro_batch 8 (the default) x 128 tokens.

Several ranks (bench/learner_ranks.py runs each side: the learner's Trainer, wrapped as the
learner wraps it, on a fixed batch; the ranks use the allocator setting the learner's ranks use,
``distributed.bound_heap``, the one-rank side too):

* ``dp_step_ratio``: step time of 1 rank x 2 threads / step time of 2 ranks x 1 thread (DDP,
  gloo), a random-init model of SmolLM2-135M's shape, 8 rollouts x 128 tokens; the first step a
  warm-up. Target >= 0.9 on an idle 2-core machine.
* ``fsdp_rss_ratio``: the larger peak RSS (VmHWM) of 2 FSDP ranks / the peak RSS of 1 rank, each
  building a random-init 321M-parameter Llama and taking an AdamW step (4 rollouts x 64 tokens),
  so that the fp32 state (16 bytes a parameter) dominates. Target <= 0.65.
  ``fsdp_rss_ratio_135m``: the same at SmolLM2-135M's shape.
* ``publish_peak_extra_gb``: the resident memory the publish adds to rank 0 of the 2 FSDP ranks
  (321M parameters gathered one at a time, cast to bf16 and streamed to a weight store in Redis),
  against ``publish_bf16_gb``, the size of one bf16 copy; ``publish_peak_extra_gb_1rank`` on one rank.

Batch: ``--quick``: one group of 8 rollouts per step (one default micro-batch), 2 steps each;
full: the default 4 groups x 8 per step, 4 steps. Sequences: 64 prompt + 64 completion tokens.
Starts a local broker (Redis: $ROLLSTREAM_BENCH_REDIS or 127.0.0.1:6379), removes its keys,
topics and temp files, stops what it started (by pid).

    python bench/learner.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
from aiokafka.errors import KafkaError as AIOKafkaError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import raw_redis_set_get
from rollstream.config import (
    CheckpointConfig,
    Config,
    InfraConfig,
    LearnerConfig,
    RLConfig,
    WeightsConfig,
)
from rollstream.config_load import to_toml
from rollstream.infra import free_port, start_broker, stop_pid
from rollstream.kafka import EventProducer, delete_topics, ensure_topics, topic_name
from rollstream.learner.batch import micro_batches
from rollstream.learner.checkpoint import read_step_log
from rollstream.learner.lora import merged_state_dict
from rollstream.learner.train import run
from rollstream.models import load_model
from rollstream.redis import connect, delete_prefix
from rollstream.schemas.events import AdvantagedRollout, GroupAdvantaged, GroupStats, Rollout
from rollstream.weights import WeightStore, pack

PROMPT, COMPLETION, GROUP = 64, 64, 8

STAGE_SCRIPT = """
import asyncio, json, logging, sys
logging.basicConfig(level="WARNING")
from rollstream.learner.train import run
from rollstream.config_load import load_config
asyncio.run(run(load_config(sys.argv[1], environ={})))
# VmHWM, not ru_maxrss: Linux carries the forking parent's high-water mark into ru_maxrss across exec.
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"maxrss_kb": int(hwm.split()[1])}))
"""


def make_groups(n: int, vocab: int, seed: int = 0) -> list[GroupAdvantaged]:
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for g in range(n):
        items = []
        for i in range(GROUP):
            ids = torch.randint(10, vocab, (PROMPT + COMPLETION,), generator=gen).tolist()
            adv = (i - (GROUP - 1) / 2) / GROUP
            items.append(AdvantagedRollout(rollout=Rollout(
                rollout_id=f"b{g}/{i}", group_id=f"b{g}", sample_index=i, group_size=GROUP, task_id="bench",
                family="bench", prompt_token_ids=ids[:PROMPT], completion_token_ids=ids[PROMPT:],
                behaviour_logprobs=[-2.0] * COMPLETION, policy_version_first=0, policy_version_last=0,
                issued_policy_version=0, finish_reason="length"), reward=adv, advantage=adv))
        groups.append(GroupAdvantaged(group_id=f"b{g}", task_id="bench", family="bench", estimator="grpo",
                                      complete=True, rollouts=items, emitted_at=time.time(),
                                      stats=GroupStats(size=GROUP, expected_size=GROUP, reward_mean=0.0,
                                                       reward_std=0.3, reward_min=-0.5, reward_max=0.5)))
    return groups


class BareLoop:
    """A plain policy-gradient loop: forward, log-softmax gather, -(A * logp) token mean,
    backward, clip, AdamW. No stats, no Kafka, no Redis."""

    def __init__(self, model_dir: Path, micro: int) -> None:
        self.model = load_model(str(model_dir))
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6)
        self.micro = micro

    def step(self, rollouts: list[AdvantagedRollout]) -> tuple[int, float]:
        """(tokens, seconds) of one step."""
        started = time.perf_counter()
        batches = micro_batches(rollouts, self.micro)
        total = sum(b.num_tokens for b in batches)
        for b in batches:
            logits = self.model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
            loss = -(b.advantages[:, None] * lp * b.loss_mask[:, 1:]).sum() / total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - started
        release_freed_memory()
        return total, elapsed


def release_freed_memory() -> None:
    """Give freed heap back to the OS (glibc keeps it per thread arena): this process holds two
    training states on a machine it shares; not timed."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


async def interleaved(config: Config, model_dir: Path, steps: list[list[GroupAdvantaged]]) -> tuple[float, float]:
    """(stage tokens/s, bare tokens/s), alternating one stage step and one bare step so that the
    load of a shared machine hits both alike; the first of each is a warm-up.

    A stage step is timed from producing its groups to the stage's step-log line: Kafka delivery,
    batching, the step, Redis progress keys and the log are all inside it.
    """
    await ensure_topics(config.infra, ["advantages", "policy"])
    bare = await asyncio.to_thread(BareLoop, model_dir, config.learner.micro_batch)
    stage = asyncio.create_task(run(config))
    stage_tokens = stage_s = bare_tokens = bare_s = 0.0
    try:
        async with EventProducer(config.infra, client_id="bench") as producer:
            for index, groups in enumerate(steps):
                sent = time.time()
                await producer.send_many([("advantages", g) for g in groups])
                while len(log := trained_steps(config)) <= index:
                    if stage.done():
                        stage.result()  # raises what killed it
                        raise RuntimeError("the learner stage stopped early")
                    await asyncio.sleep(0.02)
                tokens, seconds = await asyncio.to_thread(bare.step, [r for g in groups for r in g.rollouts])
                if index > 0:
                    stage_tokens += log[index]["tokens"]
                    stage_s += log[index]["time"] - sent
                    bare_tokens += tokens
                    bare_s += seconds
        await stage
    finally:
        stage.cancel()
    return stage_tokens / stage_s, bare_tokens / bare_s


def trained_steps(config: Config) -> list[dict]:
    return [r for r in read_step_log(config.learner.checkpoint.dir) if r["trained"]]


async def stage_peak_rss(config: Config, tmp: Path, groups: list[GroupAdvantaged]) -> float:
    """Peak RSS (GB) of a learner stage process that loads the model and takes one step."""
    await ensure_topics(config.infra, ["advantages", "policy"])
    async with EventProducer(config.infra, client_id="bench") as producer:
        await producer.send_many([("advantages", g) for g in groups])
    path = tmp / "learner.toml"
    path.write_text(to_toml(config))
    root = Path(__file__).resolve().parents[1]
    proc = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", STAGE_SCRIPT, str(path)], cwd=root,
                                   capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"learner stage failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["maxrss_kb"] / 1e6


async def broadcast(model: torch.nn.Module, redis_url: str, chunk: int, repeats: int) -> tuple[float, float, int]:
    """(learner->generator bytes/s, raw SET+GET bytes/s, bytes), best of ``repeats`` each."""
    prefix = f"bench:learner:{uuid.uuid4().hex[:8]}:"
    client = connect(redis_url)
    target = load_model_like(model)
    store = WeightStore(client, key_prefix=prefix, chunk_bytes=chunk, keep_versions=1, expire_grace_s=0)
    best_ours = best_raw = 0.0
    size = 0
    try:
        for rep in range(repeats):
            started = time.perf_counter()
            weights = await asyncio.to_thread(merged_state_dict, model, torch.bfloat16)
            published = await store.publish(rep + 1, weights, step=rep + 1)
            _, fetched = await store.fetch(published.version)
            target.load_state_dict(fetched, strict=False)
            elapsed = time.perf_counter() - started
            size = published.num_bytes
            best_ours = max(best_ours, size / elapsed)
            _, chunks = pack(weights, chunk)
            del weights, fetched
            best_raw = max(best_raw, await raw_redis_set_get(client, prefix, chunks, store.pipeline_bytes,
                                                             assemble=True))
    finally:
        await delete_prefix(client, prefix)
        await client.aclose()
    return best_ours, best_raw, size


def load_model_like(model: torch.nn.Module) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(model.config, dtype=torch.bfloat16)


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    redis_url = os.environ.get("ROLLSTREAM_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    groups_per_step, steps = (1, 2) if args.quick else (4, 4)  # the first step of each side is a warm-up
    with tempfile.TemporaryDirectory(prefix="bench-learner-") as tmp_name:
        tmp = Path(tmp_name)
        model = load_model(args.model)
        model_dir = tmp / "model"
        model.save_pretrained(model_dir)
        vocab = model.config.vocab_size
        groups = make_groups(groups_per_step * steps, vocab)
        ours_bps, raw_bps, nbytes = await broadcast(model, redis_url, WeightsConfig().chunk_bytes, 2 if args.quick else 3)
        del model
        release_freed_memory()
        port = free_port()
        broker = start_broker(port, tmp / "broker.log")
        try:
            stage_tps, bare_tps = await with_infra(
                redis_url, port, tmp, "a", groups_per_step, steps,
                lambda config: interleaved(config, model_dir, [groups[i:i + groups_per_step]
                                                              for i in range(0, len(groups), groups_per_step)]),
                model_dir)
            rss = await with_infra(redis_url, port, tmp, "b", groups_per_step, 1,
                                   lambda config: stage_peak_rss(config, tmp, groups[:groups_per_step]), model_dir)
        finally:
            stop_pid(broker.pid)
    from bench.learner_ranks import rank_figures

    ranks = rank_figures(args.quick, redis_url, Path(tempfile.mkdtemp(prefix="bench-learner-ranks-")))
    return {
        **ranks,
        "step_ratio": round(stage_tps / bare_tps, 3),
        "stage_tokens_per_s": round(stage_tps, 1),
        "bare_tokens_per_s": round(bare_tps, 1),
        "broadcast_ratio": round(ours_bps / raw_bps, 3),
        "broadcast_mb_per_s": round(ours_bps / 1e6, 1),
        "raw_redis_mb_per_s": round(raw_bps / 1e6, 1),
        "broadcast_bytes": nbytes,
        "peak_rss_gb": round(rss, 2),
        "rollouts_per_step": groups_per_step * GROUP,
        "tokens_per_rollout": PROMPT + COMPLETION,
    }


async def with_infra(redis_url: str, port: int, tmp: Path, name: str, groups_per_step: int, max_steps: int,
                     body, model_dir: Path):
    """Run ``body(config)`` with its own topics, keys and checkpoint dir; clean them up after."""
    run_id = uuid.uuid4().hex[:8]
    infra = InfraConfig(kafka_bootstrap=f"127.0.0.1:{port}", redis_url=redis_url, topic_prefix=f"bench{run_id}.",
                        key_prefix=f"bench:{run_id}:", partitions=1, state_dir=str(tmp / "state"))
    # No broadcast within the few steps of a run: the largest interval config validation accepts
    # (rl.max_staleness + 1; the stage process of peak_rss loads this config from TOML).
    staleness = 1000
    config = Config(infra=infra, rl=RLConfig(groups_per_step=groups_per_step, max_staleness=staleness),
                    learner=LearnerConfig(model=str(model_dir), broadcast_every=staleness + 1, max_steps=max_steps,
                                          checkpoint=CheckpointConfig(every=0, dir=str(tmp / f"ckpt-{name}"))))
    try:
        return await body(config)
    finally:
        await cleanup(infra, redis_url)


async def cleanup(infra: InfraConfig, redis_url: str) -> None:
    try:
        await delete_topics(infra, [topic_name(infra, n) for n in ("advantages", "policy", "advantages.dlq",
                                                                     "policy.dlq")])
    except (AIOKafkaError, OSError) as exc:  # the memory broker is stopped next anyway
        print(f"topic cleanup failed: {exc}", file=sys.stderr)
    client = connect(redis_url)
    try:
        await delete_prefix(client, infra.key_prefix)
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one group per step, 2 steps each, the ranks side by side (< 5 min on an idle machine)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--model", default="smollm2", help='"smollm2" or a local Hugging Face directory')
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"step_ratio={result['step_ratio']} broadcast_ratio={result['broadcast_ratio']} "
          f"peak_rss_gb={result['peak_rss_gb']} dp_step_ratio={result['dp_step_ratio']} "
          f"fsdp_rss_ratio={result['fsdp_rss_ratio']} fsdp_rss_ratio_135m={result['fsdp_rss_ratio_135m']} "
          f"publish_peak_extra_gb={result['publish_peak_extra_gb']}")


if __name__ == "__main__":
    main()
