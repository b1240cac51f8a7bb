"""The simulated backends (pure: no broker, no Docker): lengths and costs of the generator, the
rule of the executor, the learner's step that costs time and changes nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from rollstream.config import Config, ExecutorConfig, SimExecutorConfig, SimGeneratorConfig, SimLearnerConfig
from rollstream.consumers.executor.rewards import default_registry
from rollstream.consumers.executor.score import evaluate
from rollstream.consumers.executor.sim_sandbox import SimSandbox
from rollstream.consumers.generator.backends.base import GenerationRequest, Sampling
from rollstream.consumers.generator.backends.scripted import SimBackend, SimDecodeBackend
from rollstream.models import load_tokenizer
from rollstream.schemas.events import RewardSpec

pytestmark = pytest.mark.unit
ANSWERS = {"t/add": ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"]}


def requests(n: int, max_new_tokens: int = 512) -> list[GenerationRequest]:
    return [GenerationRequest(request_id=f"g/{i}", prompt_token_ids=[1, 2, 3], seed=1000 + i, task_id="t/add",
                              sampling=Sampling(max_new_tokens=max_new_tokens)) for i in range(n)]


async def test_sim_generator_lengths_have_a_tail_and_calls_cost_a_plus_b_longest(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    sim = SimGeneratorConfig(base_s=0.05, per_token_s=0.001, mean_tokens=40, sigma=0.8)
    backend = SimBackend(tokenizer, ANSWERS, 4096, tokenizer.eos_token_id, sim)
    started = time.perf_counter()
    out = await backend.generate(requests(64))
    seconds = time.perf_counter() - started
    lengths = sorted(len(c.token_ids) for c in out)
    assert lengths[len(lengths) // 2] < 60 and lengths[-1] > 2 * lengths[len(lengths) // 2]  # a long tail
    assert seconds >= 0.05 + 0.001 * lengths[-1] - 1e-3
    assert all(len(c.logprobs) == len(c.token_ids) and c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
               for c in out)
    again = await backend.generate(requests(64))  # seeded by the request: the same lengths again
    assert [len(c.token_ids) for c in again] == [len(c.token_ids) for c in out]
    long = [c for c in out if len(c.token_ids) > 30]
    assert long and all(c.text.startswith("```python\ndef add") for c in long)  # the answer, then filler
    cut = await backend.generate(requests(8, max_new_tokens=5))
    assert all(len(c.token_ids) <= 5 and c.finish_reason == "length" for c in cut)


async def test_sim_decode_loop_charges_per_forward_and_row_and_rows_leave_as_they_end(tiny_model_dir: Path
                                                                                      ) -> None:
    """The simulated continuous loop: one token per row per forward, a forward costing
    per_forward_s + per_row_s x rows; a short request joining a long one's loop ends first; an
    in-flight swap shows in the versions of the rows it caught in progress."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    sim = SimGeneratorConfig(mean_tokens=40, sigma=0.8, per_forward_s=0.002, per_row_s=0.0005)
    backend = SimDecodeBackend(SimBackend(tokenizer, ANSWERS, 4096, tokenizer.eos_token_id, sim), max_rows=8)
    batch = requests(8)
    expected = [len(c.token_ids) for c in await SimBackend(tokenizer, ANSWERS, 4096, tokenizer.eos_token_id,
                                                           sim).generate(batch)]
    started = time.perf_counter()
    first = asyncio.create_task(backend.generate(batch))
    while not len(backend.loop):
        await asyncio.sleep(0.001)
    await backend.load_weights(1, {})
    (short,) = await backend.generate([GenerationRequest("s/0", [1, 2], Sampling(max_new_tokens=2), seed=1,
                                                         task_id="t/add")])
    assert not first.done() and len(short.token_ids) == 2  # waited for a free row, then left first
    out = await first
    seconds = time.perf_counter() - started
    assert [len(c.token_ids) for c in out] == expected  # the same completions as the batch sim's
    assert backend.forwards >= max(expected) and seconds >= 0.002 * max(expected)
    assert all(c.policy_version_first == 0 for c in out)
    assert {c.policy_version_last for c in out} == {1}  # every row was still going when the swap came


async def test_sim_executor_scores_by_its_rule_through_the_real_reward_code() -> None:
    config = msgspec.structs.replace(Config(), executor=ExecutorConfig(backend=SimExecutorConfig()))
    sandbox = SimSandbox(config, [ANSWERS["t/add"][0]])
    spec = RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3", "assert add(0, 0) == 0"])
    verdicts = []
    for code in (ANSWERS["t/add"][0], ANSWERS["t/add"][1], "def add(a, b) return"):
        evaluation = await evaluate(sandbox, default_registry(), spec, f"```python\n{code}```", "g/0")
        verdicts.append((evaluation.scored.execution.verdict, evaluation.scored.reward))
    assert verdicts == [("pass", 1.0), ("fail", 0.0), ("syntax", -0.5)]


def test_sim_learner_step_costs_its_time_and_changes_no_weight() -> None:
    import torch

    from rollstream.config import LearnerConfig
    from rollstream.learner.trainer import SimTrainer
    from tests.helpers import group, tiny_model

    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = SimTrainer(model, LearnerConfig(backend=SimLearnerConfig(per_token_s=0.002)), pad_id=0, device="cpu")
    rollouts = group("g", [1.0, -1.0, 0.5]).rollouts
    tokens = sum(len(r.rollout.completion_token_ids) for r in rollouts)
    started = time.perf_counter()
    result = trainer.step(rollouts)
    assert time.perf_counter() - started >= 0.002 * tokens - 1e-3
    assert result.tokens == tokens and result.sequences == 3 and result.loss == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
