"""The generator stage against the real local broker and Redis, with a tiny random Llama."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from rollstream.config import Config, GeneratorConfig, RLConfig
from rollstream.config_load import to_toml
from rollstream.consumers.generator.backends.base import Sampling
from rollstream.consumers.generator.backends.hf import TransformersBackend
from rollstream.consumers.generator.stage import run
from rollstream.kafka import EventConsumer, EventProducer, ensure_topics, topic_name
from rollstream.redis import connect
from rollstream.schemas.events import ActionGenerated, Continuation, Message, PromptIssued, SamplingParams
from rollstream.testing import make_prompt
from rollstream.weights import WeightStore, set_learner_version
from tests.helpers import read_dead_letters, score_completion, wait_until

pytestmark = pytest.mark.integration

TOLERANCE = 1e-4
REPO = Path(__file__).resolve().parents[3]


def _config(config: Config, model_dir: Path, **generator: Any) -> Config:
    settings = {"model": str(model_dir), "max_new_tokens": 12, "max_batch_prompts": 2, "batch_wait_ms": 20,
                "weight_poll_s": 0.5, "temperature": 1.0}
    settings.update(generator)
    return msgspec.structs.replace(config, generator=GeneratorConfig(**settings))


def _prompt(group_id: str, group_size: int, text: str = "Write add(a, b).", **sampling: Any) -> PromptIssued:
    base = make_prompt(group_id=group_id, group_size=group_size)
    return msgspec.structs.replace(base, messages=[Message(role="user", content=text)],
                                   sampling=SamplingParams(**sampling))


async def _collect(config: Config, want: int, timeout_s: float = 60.0,
                   until: Any = None) -> list[ActionGenerated]:
    """Read ``actions`` from the beginning until ``want`` distinct rollouts (or ``until(actions)``)."""
    got: list[ActionGenerated] = []
    async with EventProducer(config.infra, client_id="reader") as producer, EventConsumer(
            config.infra, "actions", group_id=f"reader-{time.monotonic_ns()}", producer=producer,
            stage="reader") as consumer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for delivery in await consumer.getmany(timeout_s=0.5):
                got.append(delivery.event)
            if (until(got) if until else len({a.rollout.rollout_id for a in got}) >= want):
                break
    return got


def _check_fidelity(backend: TransformersBackend, config: Config, action: ActionGenerated,
                    prompt: PromptIssued) -> float:
    gen, s = config.generator, prompt.sampling
    sampling = Sampling(temperature=gen.temperature if s.temperature is None else s.temperature,
                        top_p=gen.top_p if s.top_p is None else s.top_p, top_k=gen.top_k if s.top_k is None else s.top_k)
    rollout = action.rollout
    forced = score_completion(backend.model, rollout.prompt_token_ids, rollout.completion_token_ids, sampling)
    return max(abs(a - b) for a, b in zip(forced, rollout.behaviour_logprobs, strict=True))


async def _start(config: Config, backend: TransformersBackend) -> tuple[asyncio.Task[None], asyncio.Event]:
    stop = asyncio.Event()
    return asyncio.create_task(run(config, backend=backend, stop=stop)), stop


async def test_groups_fidelity_overrides_and_dead_letters(config: Config, tiny_model_dir: Path) -> None:
    config = _config(config, tiny_model_dir)
    backend = TransformersBackend.load(str(tiny_model_dir))
    await ensure_topics(config.infra, ["prompts", "actions"])
    prompts = [_prompt("ga", 3), _prompt("gb", 2, "hi", max_new_tokens=5, temperature=0.5),
               _prompt("gc", 4, "reverse a string", top_k=10, top_p=0.9)]
    continuation = msgspec.structs.replace(_prompt("gd", 1), continuation=Continuation(
        sample_index=0, turn=2, messages=[], prompt_token_ids=[1], completion_token_ids=[], generated_mask=[],
        behaviour_logprobs=[], observation="failed"))
    async with EventProducer(config.infra, client_id="sampler") as producer:
        await producer.send_many([("prompts", p) for p in prompts] + [("prompts", continuation)])
        await producer.raw.send_and_wait(topic_name(config.infra, "prompts"), b"\x93not a prompt", key=b"gx")
    task, stop = await _start(config, backend)
    actions = await _collect(config, want=9)
    stop.set()
    await asyncio.wait_for(task, 30)
    by_group: dict[str, list[ActionGenerated]] = {}
    for action in actions:
        by_group.setdefault(action.rollout.group_id, []).append(action)
    assert {g: sorted(a.rollout.sample_index for a in acts) for g, acts in by_group.items()} == {
        "ga": [0, 1, 2], "gb": [0, 1], "gc": [0, 1, 2, 3]}
    worst = 0.0
    for prompt in prompts:
        for action in by_group[prompt.group_id]:
            rollout = action.rollout
            assert rollout.rollout_id == f"{prompt.group_id}/{rollout.sample_index}"
            assert rollout.group_size == prompt.group_size and action.reward == prompt.reward
            assert rollout.policy_version_first == rollout.policy_version_last == 0 and action.error is None
            assert action.completion_text == backend.tokenizer.decode(rollout.completion_token_ids,
                                                                      skip_special_tokens=True)
            limit = prompt.sampling.max_new_tokens or 12
            assert len(rollout.completion_token_ids) <= limit
            assert rollout.finish_reason == "stop" or len(rollout.completion_token_ids) == limit
            worst = max(worst, _check_fidelity(backend, config, action, prompt))
    print(f"stage: max log-prob difference vs teacher forcing {worst:.2e}")
    assert worst < TOLERANCE
    assert {a.rollout.logprob_temperature for a in by_group["gb"]} == {0.5}
    letters = await read_dead_letters(config.infra, "prompts", 2)
    reasons = sorted(letter.reason for letter in letters)
    assert len(letters) == 2 and any("continuation" in r for r in reasons), reasons
    assert {letter.key for letter in letters} == {b"gd", b"gx"}


async def test_prompt_longer_than_context_gives_error_actions(config: Config, short_context_model_dir: Path) -> None:
    config = _config(config, short_context_model_dir)
    backend = TransformersBackend.load(str(short_context_model_dir))
    await ensure_topics(config.infra, ["prompts", "actions"])
    async with EventProducer(config.infra, client_id="sampler") as producer:
        await producer.send_many([("prompts", _prompt("long", 2, "reverse a string " * 20)),
                                  ("prompts", _prompt("short", 2, "hi"))])
    task, stop = await _start(config, backend)
    actions = await _collect(config, want=4)
    stop.set()
    await asyncio.wait_for(task, 30)
    failed = [a for a in actions if a.rollout.group_id == "long"]
    assert len(failed) == 2 and all(a.rollout.finish_reason == "error" and "too long" in (a.error or "")
                                    and a.rollout.completion_token_ids == [] for a in failed)
    assert all(a.error is None for a in actions if a.rollout.group_id == "short")


async def test_a_short_sample_is_sent_while_a_long_group_is_still_decoding(config: Config,
                                                                         tiny_model_dir: Path) -> None:
    """The continuous decode loop: a prompt arriving after a long group joins the loop, and its
    action is sent the moment its row ends, not when the long group's call would have ended."""
    config = _config(config, tiny_model_dir, max_new_tokens=200, batch_wait_ms=0, max_batch_prompts=1)
    backend = TransformersBackend.load(str(tiny_model_dir))
    backend.model.register_forward_pre_hook(lambda *_: time.sleep(0.01))  # a forward as slow as a real model's
    await ensure_topics(config.infra, ["prompts", "actions"])
    task, stop = await _start(config, backend)
    async with EventProducer(config.infra, client_id="sampler") as producer:
        await producer.send_many([("prompts", _prompt("long", 4, "reverse a string in Python please"))])
        await wait_until(lambda: len(backend.loop) > 0, "the long group decoding")
        await producer.send_many([("prompts", _prompt("short", 1, "hi", max_new_tokens=1))])
    actions = await _collect(config, want=5)
    stop.set()
    await asyncio.wait_for(task, 30)
    short = next(a for a in actions if a.rollout.group_id == "short")
    longest = max((a for a in actions if a.rollout.group_id == "long"), key=lambda a: a.generated_at)
    assert len(longest.rollout.completion_token_ids) > 20  # the seeds' samples: a long row
    assert short.generated_at < longest.generated_at  # sent before the long group was done
    assert short.rollout.policy_version_first == 0


async def test_weight_swap_from_redis_keeps_logprobs_faithful(config: Config, tiny_model_dir: Path) -> None:
    config = _config(config, tiny_model_dir)
    backend = TransformersBackend.load(str(tiny_model_dir))
    await ensure_topics(config.infra, ["prompts", "actions"])
    redis = connect(config.infra.redis_url)
    store = WeightStore(redis, key_prefix=config.infra.key_prefix, chunk_bytes=64 << 10)
    task, stop = await _start(config, backend)
    torch.manual_seed(7)
    new = {k: (v + 0.05 * torch.randn_like(v)).to(torch.bfloat16) for k, v in backend.model.state_dict().items()}
    await store.publish(1, new, step=1)
    swapped: list[ActionGenerated] = []
    async with EventProducer(config.infra, client_id="sampler") as producer:
        for i in range(20):  # weights are swapped between batches: keep feeding until one runs on v1
            await producer.send("prompts", _prompt(f"w{i}", 2))
            got = await _collect(config, want=0, timeout_s=5,
                                 until=lambda acts: any(a.rollout.policy_version_first == 1 for a in acts))
            swapped = [a for a in got if a.rollout.policy_version_first == 1]
            if swapped:
                break
    stop.set()
    await asyncio.wait_for(task, 30)
    await redis.aclose()
    assert swapped and backend.policy_version == 1
    assert torch.equal(backend.model.state_dict()["model.norm.weight"], new["model.norm.weight"].float())
    worst = max(_check_fidelity(backend, config, a, _prompt("x", 1)) for a in swapped)
    print(f"right after the swap: max log-prob difference {worst:.2e}")
    assert worst < TOLERANCE


async def test_refuses_when_too_stale_until_weights_arrive(config: Config, tiny_model_dir: Path) -> None:
    config = _config(config, tiny_model_dir, max_staleness_refuse=True)
    config = msgspec.structs.replace(config, rl=RLConfig(max_staleness=1))
    backend = TransformersBackend.load(str(tiny_model_dir))
    await ensure_topics(config.infra, ["prompts", "actions"])
    redis = connect(config.infra.redis_url)
    await set_learner_version(redis, config.infra.key_prefix, 3)
    task, stop = await _start(config, backend)
    async with EventProducer(config.infra, client_id="sampler") as producer:
        await producer.send("prompts", _prompt("stale", 2))
    assert await _collect(config, want=1, timeout_s=4) == []  # 3 versions behind, max 1: held
    store = WeightStore(redis, key_prefix=config.infra.key_prefix, chunk_bytes=64 << 10)
    await store.publish(3, backend.model.state_dict(), step=3)
    actions = await _collect(config, want=2, timeout_s=30)
    stop.set()
    await asyncio.wait_for(task, 30)
    await redis.aclose()
    assert len({a.rollout.rollout_id for a in actions}) == 2
    assert all(a.rollout.policy_version_first == 3 for a in actions)


def _spawn(config_path: Path, log: Path) -> subprocess.Popen[bytes]:
    """``rollstream generator`` as a user starts it (a SIGTERM that arrives while it still waits for
    its partitions ends it with status 0, as the command does)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "rollstream.cli", "generator", "--config", str(config_path),
                             "--log-level", "INFO"], cwd=REPO, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


@pytest.mark.timeout(300)
async def test_sigkill_mid_group_then_restart_loses_nothing(config: Config, tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    config = _config(config, tiny_model_dir, max_batch_prompts=1, max_new_tokens=48)
    config_path = tmp_path / "generator.toml"
    config_path.write_text(to_toml(config))
    await ensure_topics(config.infra, ["prompts", "actions"])
    prompts = [_prompt(f"k{i}", 4) for i in range(6)]
    async with EventProducer(config.infra, client_id="sampler") as producer:
        await producer.send_many([("prompts", p) for p in prompts])
    log = tmp_path / "generator.log"
    first = _spawn(config_path, log)
    try:
        before = await _collect(config, want=1, timeout_s=120)
        assert before, log.read_text()[-3000:]
        first.send_signal(signal.SIGKILL)  # mid-way through the prompts, maybe mid-group
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    second = _spawn(config_path, log)
    try:
        actions = await _collect(config, want=24, timeout_s=180)
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            assert second.wait(60) == 0, log.read_text()[-3000:]
        finally:
            if second.poll() is None:
                second.kill()
    ids = Counter(a.rollout.rollout_id for a in actions)
    assert set(ids) == {f"k{i}/{j}" for i in range(6) for j in range(4)}, log.read_text()[-3000:]
    print(f"before kill: {len(before)} actions; total {len(actions)}, duplicates {sum(ids.values()) - len(ids)}")


async def test_sampling_beyond_the_stage_ceilings_is_bounded_not_fatal(config: Config, tiny_model_dir: Path) -> None:
    """Schema-valid but impossible sampling: a top_k of 2**64 - 1 (crashed the sampling tensors, on
    every restart) is off; a max_new_tokens of 131072 is cut to generator.max_new_tokens_limit."""
    config = _config(config, tiny_model_dir, max_new_tokens_limit=16)
    backend = TransformersBackend.load(str(tiny_model_dir))
    await ensure_topics(config.infra, ["prompts", "actions"])
    prompts = [_prompt("huge-k", 2, top_k=2**64 - 1), _prompt("long", 2, max_new_tokens=131072, temperature=2.0)]
    async with EventProducer(config.infra, client_id="sampler") as producer:
        await producer.send_many([("prompts", p) for p in prompts])
    task, stop = await _start(config, backend)
    actions = await _collect(config, want=4)
    stop.set()
    await asyncio.wait_for(task, 30)
    assert sorted(a.rollout.rollout_id for a in actions) == ["huge-k/0", "huge-k/1", "long/0", "long/1"]
    assert all(a.error is None and len(a.rollout.completion_token_ids) <= 16 for a in actions)
