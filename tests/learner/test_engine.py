"""The learner's engine levers against the plain path: the fused log-prob pass, prefix sharing,
bf16 autocast (tiny random-init Llama models; unit tier)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
import torch
import transformers

from rollstream.config import Config, LearnerConfig, OptimConfig
from rollstream.learner import loss as loss_module
from rollstream.learner.batch import collate, group_micro_batches
from rollstream.learner.loss import token_logprobs
from rollstream.learner.train import LearnerLoop, Lineage
from rollstream.learner.trainer import Trainer, completion_logprobs, shared_prefix
from rollstream.schemas.events import AdvantagedRollout
from tests.helpers import rollout

pytestmark = pytest.mark.unit

VOCAB = 96


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config)
    model.train()
    return model


def shared_group(group_id: str, size: int, *, prompt_len: int = 7, seed: int = 0,
                 temperature: float | None = None) -> list[AdvantagedRollout]:
    """``size`` rollouts of one prompt, completions of different lengths (so the batch pads)."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(1, VOCAB, (prompt_len,), generator=gen).tolist()
    items = []
    for i in range(size):
        completion = torch.randint(1, VOCAB, (3 + (i * 5) % 9,), generator=gen).tolist()
        r = rollout(group_id, i, prompt, completion, group_size=size)
        if temperature is not None:
            r = type(r)(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "logprob_temperature": temperature})
        adv = (i - (size - 1) / 2) / size
        items.append(AdvantagedRollout(rollout=r, reward=adv, advantage=adv))
    return items


def reference_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: torch.Tensor):
    """The unfused formula: the full [B, T, V] log-softmax."""
    logp = torch.log_softmax(logits[:, :-1].float() / temperature.view(-1, 1, 1), dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return picked, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7 * 50, 1 << 22])
def test_fused_logprobs_match_log_softmax(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    logits = torch.randn(3, 20, 50, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 50, (3, 20))
    temps = torch.tensor([1.0, 0.7, 1.3])
    weight = torch.randn(3, 19, dtype=torch.float64)
    logp, entropy = token_logprobs(logits, ids, temps)
    assert torch.equal(logp[:, 0], torch.zeros(3)) and not entropy.requires_grad
    (logp[:, 1:] * weight).sum().backward()
    fused_grad, logits.grad = logits.grad, None
    ref, ref_entropy = reference_logprobs(logits, ids, temps)
    (ref * weight).sum().backward()
    torch.testing.assert_close(logp[:, 1:].double(), ref.double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[:, 1:].double(), ref_entropy.double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_grad, logits.grad, atol=1e-6, rtol=1e-5)


def test_shared_prefix_length() -> None:
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [1, 2, 3, 4, 0]])
    assert shared_prefix(ids, 5) == 3
    assert shared_prefix(ids, 2) == 2
    assert shared_prefix(ids[:1], 5) == 0  # one row: nothing to share
    assert shared_prefix(torch.tensor([[1, 2], [3, 2]]), 2) == 0


@pytest.mark.parametrize("temperature", [None, 0.7])
def test_prefix_sharing_gives_the_unshared_logprobs_and_gradients(temperature: float | None) -> None:
    model = tiny_llama()
    batch = collate(shared_group("g", 6, temperature=temperature))
    results = []
    for share in (False, True):
        model.zero_grad()
        logp, entropy = completion_logprobs(model, batch, share_prefix=share)
        (logp * batch.loss_mask * torch.linspace(-1, 1, logp.shape[0]).unsqueeze(1)).sum().backward()
        results.append((logp.detach(), entropy, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (plain, plain_entropy, plain_grad), (shared, shared_entropy, shared_grad) = results
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared_entropy, plain_entropy, atol=1e-5, rtol=1e-5)
    assert plain_grad.abs().max() > 0
    assert (shared_grad - plain_grad).norm() <= 1e-5 * plain_grad.norm()


def settings(**overrides) -> LearnerConfig:
    return LearnerConfig(micro_batch=4, optim=OptimConfig(lr=1e-3, warmup_steps=0), **overrides)


def step_gradients(model: torch.nn.Module, items: list[AdvantagedRollout], **overrides) -> torch.Tensor:
    """The gradient of one Trainer step (caught at the optimizer, which is not run)."""
    trainer = Trainer(model, settings(**overrides))
    caught: list[torch.Tensor] = []
    trainer.before_update = lambda: caught.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    trainer.step(items)
    return caught[0]


def test_trainer_step_with_prefix_sharing_has_the_plain_gradient() -> None:
    items = shared_group("a", 6, seed=1) + shared_group("b", 5, prompt_len=4, seed=2)
    plain = step_gradients(tiny_llama(), items, prefix_sharing=False)
    shared = step_gradients(tiny_llama(), items, prefix_sharing=True)
    assert (shared - plain).norm() <= 1e-5 * plain.norm()


def test_group_micro_batches_keep_groups_apart() -> None:
    items = shared_group("a", 6, seed=1) + shared_group("b", 5, seed=2)
    batches = group_micro_batches(items, 4)
    assert [len(b.rollout_ids) for b in batches] == [4, 2, 4, 1]
    for b in batches:
        assert len({rid.split("/")[0] for rid in b.rollout_ids}) == 1


def test_bf16_autocast_logprobs_stay_near_fp32() -> None:
    """learner.dtype = "bfloat16": the sampled tokens' log-probs within 0.1 nat (max) and 0.02
    (mean) of fp32 on a random model, and a step still trains."""
    model = tiny_llama()
    batch = collate(shared_group("g", 6))
    with torch.no_grad():
        fp32, _ = completion_logprobs(model, batch)
        bf16, _ = completion_logprobs(model, batch, dtype=torch.bfloat16)
    mask = batch.loss_mask.bool()
    diff = (fp32 - bf16)[mask].abs()
    assert diff.max() < 0.1 and diff.mean() < 0.02
    grad = step_gradients(tiny_llama(), shared_group("g", 6), dtype="bfloat16")
    assert torch.isfinite(grad).all() and grad.abs().max() > 0


class SlowStore:
    """A weight store that reads the streamed tensors slowly and keeps copies of them."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.finished_at = 0.0

    async def publish_stream(self, version: int, tensors, *, step: int, files: dict) -> SimpleNamespace:
        async for name, tensor in tensors:
            await asyncio.sleep(0.005)
            self.tensors[name] = tensor.clone()
        self.finished_at = time.perf_counter()
        return SimpleNamespace(version=version, num_bytes=0)


class Recorder:
    """Stands in for the producer, Redis and the metrics: records what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def send(self, *args) -> None:
        self.calls.append(("send", *args))

    async def set(self, *args) -> None:
        self.calls.append(("set", *args))

    def observe(self, *args) -> None: ...


async def overlapped_publish_then_step(model: torch.nn.Module, trainer: Trainer, store: SlowStore,
                                       items: list[AdvantagedRollout]) -> float:
    config = Config(learner=settings(broadcast_dtype="float32", overlap_publish=True))
    recorder = Recorder()
    metrics = SimpleNamespace(broadcast_seconds=recorder, publish_peak_extra=SimpleNamespace(set=lambda _: None))
    loop = LearnerLoop(config, trainer, None, Lineage(step=1, version=1), None, recorder, store, recorder,
                       metrics, "run-1")  # type: ignore[arg-type]
    publisher = loop.publisher
    assert publisher.overlap
    updated_at = []
    trainer.before_update = (lambda wait: lambda: (wait(), updated_at.append(time.perf_counter())))(
        trainer.before_update)
    await publisher.publish(overlap=True)
    assert publisher.publishing is not None and not publisher.publishing.done()  # the step runs while it publishes
    await asyncio.to_thread(trainer.step, items)
    await publisher.done()
    assert [call[1] for call in recorder.calls if call[0] == "send"] == ["policy"]  # announced once
    return updated_at[0]


def test_overlapped_publish_reads_the_weights_before_the_next_update() -> None:
    """learner.overlap_publish: the next step's forward/backward run during the publish, its
    optimizer update waits, and the store gets exactly the published version's weights."""
    model = tiny_llama()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model, settings())
    store = SlowStore()
    updated_at = asyncio.run(overlapped_publish_then_step(model, trainer, store, shared_group("g", 4)))
    assert updated_at >= store.finished_at
    assert set(store.tensors) >= set(before) - {"lm_head.weight"}
    for name, tensor in store.tensors.items():
        assert torch.equal(tensor, before[name]), name
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())  # the step did train
