"""Plumbing overhead, measured side by side in one run.

* ``hop_ratio``: events/s through one hop with rollstream's codec and plumbing
  (EventProducer.send_many -> EventConsumer.getmany + done + commit) divided by events/s of
  raw aiokafka producing (``send`` per record) and consuming the same pre-encoded bytes, with
  the same linger, batch size and consumer fetch settings. Target >= 0.7.
* ``weights_ratio``: publish + fetch throughput of a 135M-parameter bf16 state dict through
  the WeightStore (checksums, manifest, verification, assembly) divided by raw redis-py
  pipelined SET + GET of the same bytes in the same chunk sizes. Target >= 0.7.

Starts a local broker on a free port (Redis: $ROLLSTREAM_BENCH_REDIS or 127.0.0.1:6379),
deletes its topics and keys and stops the broker at the end.

    python bench/plumbing.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec
import torch
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import raw_redis_set_get, report, with_local_broker
from rollstream.config import InfraConfig
from rollstream.kafka import EventConsumer, EventProducer, delete_topics, ensure_topics, topic_name
from rollstream.lifecycle import tune_gc
from rollstream.redis import connect, delete_prefix
from rollstream.schemas import RewardScored, codec
from rollstream.testing import make_reward
from rollstream.weights import WeightStore, pack


def realistic_reward(i: int) -> RewardScored:
    """A RewardScored of a typical size: 300 prompt + 256 completion tokens with log-probs."""
    base = make_reward(group_id=f"g{i // 8}", sample_index=i % 8)
    rollout = msgspec.structs.replace(
        base.rollout, prompt_token_ids=list(range(300)), completion_token_ids=list(range(1000, 1256)),
        behaviour_logprobs=[-0.1 * (j % 7) for j in range(256)],
    )
    return msgspec.structs.replace(base, rollout=rollout)


async def _joined(consumer: AIOKafkaConsumer) -> None:
    """Wait until the consumer has its partitions, so group joins stay out of both timings."""
    while not consumer.assignment():
        await consumer.getmany(timeout_ms=100)


async def raw_hop(infra: InfraConfig, topic: str, values: list[tuple[bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=infra.kafka_bootstrap, acks="all",
                                linger_ms=infra.linger_ms, max_batch_size=infra.max_batch_bytes)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=infra.kafka_bootstrap, group_id=f"raw-{uuid.uuid4().hex[:6]}",
                                enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=2000,
                                fetch_max_wait_ms=infra.fetch_max_wait_ms)  # as EventConsumer's
    await producer.start()
    await consumer.start()
    try:
        await _joined(consumer)
        start = time.perf_counter()
        futures = [await producer.send(topic, value, key=key) for key, value in values]
        await asyncio.gather(*futures)
        seen = 0
        while seen < len(values):
            for records in (await consumer.getmany(timeout_ms=1000, max_records=2000)).values():
                seen += len(records)
            await consumer.commit()
        return len(values) / (time.perf_counter() - start)
    finally:
        await consumer.stop()
        await producer.stop()


async def plumbing_hop(infra: InfraConfig, events: list[RewardScored]) -> float:
    async with EventProducer(infra, client_id="bench") as producer:
        async with EventConsumer(infra, "rewards", group_id=f"plumb-{uuid.uuid4().hex[:6]}", producer=producer,
                                 stage="bench", max_poll_records=2000) as consumer:
            await _joined(consumer.raw)
            start = time.perf_counter()
            await producer.send_many([("rewards", e) for e in events])
            seen = 0
            while seen < len(events):
                for delivery in await consumer.getmany(max_records=2000, timeout_s=1.0):
                    consumer.done(delivery)
                    seen += 1
                await consumer.commit()
            return len(events) / (time.perf_counter() - start)


def smollm2_shaped_state(dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Random tensors with SmolLM2-135M's parameter shapes (134.5M parameters)."""
    vocab, hidden, inter, layers, kv = 49152, 576, 1536, 30, 192
    gen = torch.Generator().manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen).to(dtype)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj.weight", (hidden, hidden)), ("self_attn.k_proj.weight", (kv, hidden)),
                            ("self_attn.v_proj.weight", (kv, hidden)), ("self_attn.o_proj.weight", (hidden, hidden)),
                            ("mlp.gate_proj.weight", (inter, hidden)), ("mlp.up_proj.weight", (inter, hidden)),
                            ("mlp.down_proj.weight", (hidden, inter)), ("input_layernorm.weight", (hidden,)),
                            ("post_attention_layernorm.weight", (hidden,))):
            state[p + name] = torch.randn(*shape, generator=gen).to(dtype)
    state["model.norm.weight"] = torch.ones(hidden, dtype=dtype)
    return state


async def store_round(store: WeightStore, state: dict[str, torch.Tensor], version: int, nbytes: int) -> float:
    start = time.perf_counter()
    await store.publish(version, state, step=version)
    await store.fetch(version)
    return nbytes / (time.perf_counter() - start)


async def bench(quick: bool, redis_url: str, bootstrap: str) -> dict[str, float]:
    run = uuid.uuid4().hex[:8]
    infra = InfraConfig(kafka_bootstrap=bootstrap, redis_url=redis_url, topic_prefix=f"bench{run}.",
                        key_prefix=f"bench:{run}:", partitions=4, linger_ms=5, state_dir=tempfile.mkdtemp())
    n = 5000 if quick else 40000
    rounds = 3 if quick else 5
    weight_rounds = 5 if quick else 8  # ~1 s each; Redis page faulting makes single rounds noisy
    events = [realistic_reward(i) for i in range(n)]
    reward_codec = codec(RewardScored)
    raw_values = [(e.rollout.group_id.encode(), reward_codec.encode(e)) for e in events]
    raw_rates, plumbing_rates = [], []
    created: list[str] = []
    try:
        for r in range(rounds):  # interleaved, best of each: the machine is noisy
            # Fresh, empty topics with the same layout for each side of each round, so both
            # consumers join their group before any data exists.
            ours = msgspec.structs.replace(infra, topic_prefix=f"bench{run}r{r}.")
            raw = msgspec.structs.replace(infra, topic_prefix=f"bench{run}r{r}raw.")
            await ensure_topics(ours, ["rewards"])
            await ensure_topics(raw, ["rewards"], with_dlq=False)
            created += [topic_name(ours, "rewards"), topic_name(ours, "rewards.dlq"), topic_name(raw, "rewards")]
            plumbing_rates.append(await plumbing_hop(ours, events))
            raw_rates.append(await raw_hop(raw, topic_name(raw, "rewards"), raw_values))
    finally:
        await delete_topics(infra, created)

    state = smollm2_shaped_state()
    client = connect(redis_url)
    store = WeightStore(client, key_prefix=infra.key_prefix, expire_grace_s=0, keep_versions=1)
    _, chunks = pack(state, store.chunk_bytes)
    nbytes = sum(c.nbytes for c in chunks)
    raw_bps, store_bps = [], []
    try:
        for version in range(1, weight_rounds + 1):
            raw_bps.append(await raw_redis_set_get(client, infra.key_prefix, chunks, store.pipeline_bytes))
            store_bps.append(await store_round(store, state, version, nbytes))
    finally:
        await delete_prefix(client, infra.key_prefix)
        await client.aclose()
    return {
        "hop_ratio": round(max(plumbing_rates) / max(raw_rates), 3),
        "hop_events_per_s": round(max(plumbing_rates)),
        "raw_events_per_s": round(max(raw_rates)),
        "weights_ratio": round(max(store_bps) / max(raw_bps), 3),
        "weights_mb_per_s": round(max(store_bps) / 1e6, 1),
        "raw_redis_mb_per_s": round(max(raw_bps) / 1e6, 1),
        "weights_bytes": nbytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under 2 minutes")
    parser.add_argument("--json", dest="json_out", help="write the figures here")
    args = parser.parse_args()
    redis_url = os.environ.get("ROLLSTREAM_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    tune_gc()  # as every stage process does (rollstream.cli); applies to both sides of each ratio
    report(with_local_broker(lambda bootstrap: bench(args.quick, redis_url, bootstrap)), args.json_out)


if __name__ == "__main__":
    main()
