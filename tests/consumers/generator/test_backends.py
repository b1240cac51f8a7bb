"""The sampling math and the transformers backend, on a tiny random Llama (real SmolLM2 only in slow tests).

Log-prob fidelity tolerance: 1e-4 absolute (float32 on CPU; measured max differences are ~1e-5).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from rollstream.consumers.generator.backends.base import (
    GenerationBackend,
    GenerationRequest,
    Sampling,
    completions_as_done,
    error_completion,
)
from rollstream.consumers.generator.backends.hf import TransformersBackend, sample_batch
from rollstream.consumers.generator.backends.sampling import (
    derive_seed,
    find_stop,
    processed_logprobs,
    sample_tokens,
)
from rollstream.consumers.generator.chat import chat_prompt_ids, eos_token_ids
from rollstream.errors import BackendError
from rollstream.models import load_policy
from tests.helpers import score_completion

TOLERANCE = 1e-4
# The real model's 30 layers in fp32: incremental decoding and one teacher-forced forward sum in
# different orders. Alone this test reads 1.3e-5; one CI run on 2026-12-04 read 2.05e-4 on the same
# tokens (the CPU kernels' reduction order is not fixed from run to run). A wrong position, mask or
# temperature moves log-probs by 1e-2 or more.
SMOLLM2_TOLERANCE = 1e-3


@pytest.fixture
def backend(tiny_model_dir: Path) -> TransformersBackend:
    return TransformersBackend.load(str(tiny_model_dir))


def _prompt(backend: TransformersBackend, text: str) -> list[int]:
    return chat_prompt_ids(backend.tokenizer, [{"role": "user", "content": text}])


def _requests(backend: TransformersBackend, n: int, sampling: Sampling, seed: int = 0) -> list[GenerationRequest]:
    texts = ["Write a function", "hi", "reverse a string in Python please", "0123"]
    return [GenerationRequest(f"g/{i}", _prompt(backend, texts[i % len(texts)]), sampling, seed=seed + i)
            for i in range(n)]


# ---- pure sampling math -------------------------------------------------------------------


@pytest.mark.unit
def test_processed_logprobs_temperature_only_is_tempered_softmax() -> None:
    logits = torch.randn(3, 50)
    temperature = torch.tensor([1.0, 0.5, 2.0])
    out = processed_logprobs(logits, temperature, torch.ones(3), torch.zeros(3, dtype=torch.long))
    assert torch.allclose(out, (logits / temperature[:, None]).log_softmax(-1), atol=1e-6)


@pytest.mark.unit
def test_top_k_and_top_p_keep_the_right_sets() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3)
    out = processed_logprobs(logits, torch.ones(3), torch.tensor([1.0, 0.7, 0.99]), torch.tensor([2, 0, 0]))
    kept = torch.isfinite(out)
    assert kept[0].tolist() == [True, True, False, False, False]  # top-k 2
    probs = logits[1].softmax(-1)  # [0.64, 0.24, 0.09, ...]: 0.64 < 0.7 so two tokens are needed
    assert probs[0] < 0.7 < probs[:2].sum()
    assert kept[1].tolist() == [True, True, False, False, False]
    assert kept[2].sum() >= 4
    assert torch.allclose(out.exp().sum(-1), torch.ones(3), atol=1e-6)  # renormalised


@pytest.mark.unit
def test_greedy_rows_take_argmax_with_untempered_logprob() -> None:
    logits = torch.randn(2, 20)
    out = processed_logprobs(logits, torch.zeros(2), torch.tensor([0.1, 0.1]), torch.tensor([1, 1]))
    assert torch.allclose(out, logits.log_softmax(-1), atol=1e-6)  # no truncation, temperature 1
    gens = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    tokens, chosen = sample_tokens(out, [True, True], gens)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    assert torch.allclose(chosen, out.gather(1, tokens[:, None])[:, 0])


@pytest.mark.unit
def test_find_stop_and_seed_derivation() -> None:
    assert find_stop("abc```def", ["```"]) == 6
    assert find_stop("a STOP b END", ["END", "STOP"]) == 6
    assert find_stop("nothing", ["x", ""]) == -1
    assert derive_seed(0, "g", 1) == derive_seed(0, "g", 1)
    assert len({derive_seed(0, "g", i) for i in range(100)} | {derive_seed(1, "g", 0)}) == 101


# ---- the transformers backend -------------------------------------------------------------


def _max_diff(backend: TransformersBackend, requests, completions) -> float:
    worst = 0.0
    for request, completion in zip(requests, completions, strict=True):
        forced = score_completion(backend.model, request.prompt_token_ids, completion.token_ids, request.sampling)
        worst = max([worst] + [abs(a - b) for a, b in zip(forced, completion.logprobs, strict=True)])
    return worst


@pytest.mark.unit
async def test_logprobs_match_teacher_forcing_in_a_mixed_batch(backend: TransformersBackend) -> None:
    settings = [Sampling(temperature=1.0, max_new_tokens=24), Sampling(temperature=0.7, top_p=0.9, max_new_tokens=24),
                Sampling(temperature=1.3, top_k=20, max_new_tokens=24), Sampling(temperature=0.0, max_new_tokens=24)]
    requests = [GenerationRequest(f"g/{i}", r.prompt_token_ids, settings[i % 4], seed=i)
                for i, r in enumerate(_requests(backend, 8, Sampling()))]
    completions = await backend.generate(requests)
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in completions)
    diff = _max_diff(backend, requests, completions)
    print(f"max |behaviour - teacher-forced| log-prob difference: {diff:.2e}")
    assert diff < TOLERANCE
    # Independent of processed_logprobs: plain tempered log-softmax of a full forward pass.
    request, completion = requests[0], completions[0]
    ids = torch.tensor([request.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, len(request.prompt_token_ids) - 1 : -1]
    plain = logits.log_softmax(-1).gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    assert max(abs(a - b) for a, b in zip(plain.tolist(), completion.logprobs)) < TOLERANCE
    assert {c.logprob_temperature for c in completions} == {1.0, 0.7, 1.3}
    # With top-p the recorded log-probs are still the tempered, untruncated ones (what the learner
    # and SGLang compute), not those of the cut distribution the token was drawn from.
    request, completion = requests[1], completions[1]
    ids = torch.tensor([request.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0, len(request.prompt_token_ids) - 1 : -1]
    tempered = (logits / 0.7).log_softmax(-1).gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    assert max(abs(a - b) for a, b in zip(tempered.tolist(), completion.logprobs)) < TOLERANCE
    cut = processed_logprobs(logits, torch.full((len(logits),), 0.7), torch.full((len(logits),), 0.9),
                             torch.zeros(len(logits), dtype=torch.long))
    cut = cut.gather(1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    assert bool((cut >= tempered - 1e-6).all()) and bool((cut > tempered + 1e-4).any())  # renormalised: differs


@pytest.mark.unit
async def test_logprobs_match_right_after_a_weight_swap(backend: TransformersBackend) -> None:
    requests = _requests(backend, 4, Sampling(temperature=1.0, max_new_tokens=16))
    before = await backend.generate(requests)
    torch.manual_seed(1)
    new = {k: (v + 0.05 * torch.randn_like(v)).to(torch.bfloat16) for k, v in backend.model.state_dict().items()}
    await backend.load_weights(3, new)
    assert backend.policy_version == 3
    after = await backend.generate(requests)
    assert all(c.policy_version_first == c.policy_version_last == 3 for c in after)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    diff = _max_diff(backend, requests, after)
    print(f"after swap: max log-prob difference {diff:.2e}")
    assert diff < TOLERANCE
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(backend.model.state_dict()[name], new[name].float())


@pytest.mark.unit
async def test_bad_weights_are_refused_and_nothing_is_loaded(backend: TransformersBackend) -> None:
    original = {k: v.clone() for k, v in backend.model.state_dict().items()}
    first_key = next(iter(original))
    broken_shape = {k: v.clone() + 1 for k, v in original.items()}
    broken_shape["model.norm.weight"] = torch.ones(3)  # after many good tensors, to catch partial copies
    missing = {k: v for k, v in original.items() if k != first_key}
    with_nan = {k: v.clone() for k, v in original.items()}
    with_nan["model.norm.weight"][0] = float("nan")
    for bad in (broken_shape, missing, with_nan, {**original, "extra.weight": torch.ones(1)}):
        with pytest.raises(BackendError):
            await backend.load_weights(9, bad)
    assert backend.policy_version == 0
    assert all(torch.equal(v, original[k]) for k, v in backend.model.state_dict().items())


@pytest.mark.unit
async def test_max_new_tokens_stop_strings_and_eos(backend: TransformersBackend) -> None:
    base = await backend.generate(_requests(backend, 3, Sampling(temperature=1.0, max_new_tokens=12)))
    assert all(c.finish_reason == "length" and len(c.token_ids) == 12 for c in base if c.finish_reason != "stop")
    tokenizer = backend.tokenizer
    # A stop string that the same seed is bound to produce: the decoded 4th token of sample 0.
    probe = base[0].token_ids
    stop = next(tokenizer.decode([t]) for t in probe[3:] if tokenizer.decode([t]).strip())
    stopped = await backend.generate(_requests(backend, 3, Sampling(temperature=1.0, max_new_tokens=12, stop=(stop,))))
    first = stopped[0]
    assert first.finish_reason == "stop"
    assert first.token_ids == probe[: len(first.token_ids)]  # same seed, same tokens up to the stop
    assert first.text == tokenizer.decode(first.token_ids, skip_special_tokens=True)
    assert stop in first.text
    assert stop not in tokenizer.decode(first.token_ids[:-1], skip_special_tokens=True)  # cut at the first one
    # EOS: a token known to be sampled at step 2 ends the completion and is kept with its log-prob.
    request = _requests(backend, 1, Sampling(temperature=1.0, max_new_tokens=12))[0]
    eos = {probe[2]} - set(probe[:2])
    if eos:
        out = sample_batch(backend.model, tokenizer, [request], eos=eos, context=backend.max_context, version=0)[0]
        assert out.finish_reason == "stop" and out.token_ids == probe[:3] and len(out.logprobs) == 3


@pytest.mark.unit
async def test_seeded_determinism(backend: TransformersBackend) -> None:
    sampling = Sampling(temperature=1.0, top_p=0.95, max_new_tokens=16)
    requests = _requests(backend, 4, sampling)
    first, second = await backend.generate(requests), await backend.generate(requests)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]
    assert [c.logprobs for c in first] == [c.logprobs for c in second]
    alone = await backend.generate([requests[2]])  # a row's samples do not depend on its batch neighbours
    assert alone[0].token_ids == first[2].token_ids
    reseeded = await backend.generate(_requests(backend, 4, sampling, seed=100))
    assert [c.token_ids for c in reseeded] != [c.token_ids for c in first]


@pytest.mark.unit
async def test_prompt_longer_than_context_is_a_recorded_failure(short_context_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(short_context_model_dir))
    assert backend.max_context == 32
    long_prompt = _prompt(backend, "reverse a string in Python please " * 4)
    assert len(long_prompt) >= 32
    ok_prompt = _prompt(backend, "hi")
    requests = [GenerationRequest("g/0", long_prompt, Sampling(max_new_tokens=8), seed=0),
                GenerationRequest("g/1", ok_prompt, Sampling(max_new_tokens=100), seed=1)]
    bad, good = await backend.generate(requests)
    assert bad.finish_reason == "error" and "too long" in (bad.error or "") and bad.token_ids == []
    assert good.error is None and len(ok_prompt) + len(good.token_ids) <= 32  # cut at the context


@pytest.mark.unit
async def test_between_batches_swap_waits_for_the_rows_in_the_loop(tiny_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir), update="between_batches")
    requests = _requests(backend, 2, Sampling(max_new_tokens=16))
    new = {k: v + 0.01 for k, v in backend.model.state_dict().items()}
    gen_task = asyncio.create_task(backend.generate(requests))
    await asyncio.sleep(0)  # the loop holds the lock first
    swap = asyncio.create_task(backend.load_weights(1, new))
    while not backend._draining:  # the swap is waiting for the loop to drain
        await asyncio.sleep(0.001)
    late = asyncio.create_task(backend.generate(_requests(backend, 1, Sampling(max_new_tokens=4), seed=7)))
    completions = await gen_task
    await swap
    assert all(c.policy_version_first == c.policy_version_last == 0 for c in completions)
    assert backend.policy_version == 1
    (after,) = await late  # asked for while the swap waited: not admitted until it was done
    assert after.policy_version_first == after.policy_version_last == 1


@pytest.mark.unit
async def test_in_flight_swap_lets_rows_continue_under_the_new_weights(tiny_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir))
    assert backend.update == "in_flight"
    requests = _requests(backend, 2, Sampling(max_new_tokens=48))
    new = {k: v + 0.01 for k, v in backend.model.state_dict().items()}
    gen_task = asyncio.create_task(backend.generate(requests))
    while not any(row.tokens for row in backend.loop.rows):
        await asyncio.sleep(0.001)
    await backend.load_weights(1, new)
    assert not gen_task.done()  # swapped while the rows were in progress
    completions = await gen_task
    assert all(c.policy_version_first == 0 and c.policy_version_last == 1 for c in completions)


@pytest.mark.unit
async def test_a_short_request_does_not_wait_for_a_long_one(backend: TransformersBackend) -> None:
    long = asyncio.create_task(backend.generate(_requests(backend, 2, Sampling(max_new_tokens=96))))
    while not len(backend.loop):
        await asyncio.sleep(0.001)
    (short,) = await backend.generate(_requests(backend, 1, Sampling(max_new_tokens=4), seed=50))
    assert len(short.token_ids) <= 4 and not long.done()  # it joined the running loop and left it first
    assert len(backend.loop) == 2
    done = await long
    assert all(len(c.token_ids) == 96 or c.finish_reason == "stop" for c in done)


@pytest.mark.unit
async def test_a_cancelled_call_leaves_the_loop(backend: TransformersBackend) -> None:
    task = asyncio.create_task(backend.generate(_requests(backend, 3, Sampling(max_new_tokens=200))))
    while not len(backend.loop):
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (after,) = await backend.generate(_requests(backend, 1, Sampling(max_new_tokens=3)))
    assert len(after.token_ids) <= 3 and not len(backend.loop)  # the abandoned rows left with it


@pytest.mark.integration
async def test_smollm2_from_the_wheel_generates_with_faithful_logprobs(tmp_path: Path) -> None:
    """GGUF -> plain model, cached; the cached copy is the same model; sampled log-probs are faithful."""
    converted, tokenizer = load_policy("smollm2", cache_dir=tmp_path)  # converts the GGUF, writes the cache
    assert not hasattr(converted.config, "quantization_config")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("SmolLM2")]  # the cache was written
    cached, cached_tokenizer = load_policy("smollm2", cache_dir=tmp_path)  # reads the cache
    assert all(torch.equal(v, converted.state_dict()[k]) for k, v in cached.state_dict().items())
    messages = [{"role": "user", "content": "Write a Python function add(a, b) that returns the sum."}]
    assert chat_prompt_ids(tokenizer, messages) == chat_prompt_ids(cached_tokenizer, messages)
    assert eos_token_ids(converted, tokenizer) == eos_token_ids(cached, cached_tokenizer)
    backend = TransformersBackend(cached, cached_tokenizer)
    assert backend.max_context == 8192
    prompt = chat_prompt_ids(cached_tokenizer, messages)
    sampling = Sampling(temperature=0.8, top_p=0.95, max_new_tokens=24, stop=("```\n\n",))
    requests = [GenerationRequest(f"s/{i}", prompt, sampling, seed=i) for i in range(2)]
    completions = await backend.generate(requests)
    diff = _max_diff(backend, requests, completions)
    print(f"SmolLM2: max log-prob difference {diff:.2e}; sample: {completions[0].text!r}")
    assert diff < SMOLLM2_TOLERANCE


@pytest.mark.unit
async def test_the_loop_holds_at_most_max_rows_and_the_rest_join_as_rows_leave(tiny_model_dir: Path) -> None:
    backend = TransformersBackend.load(str(tiny_model_dir), max_rows=2)
    sizes: list[int] = []
    handle = backend.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        requests = _requests(backend, 6, Sampling(temperature=1.0, max_new_tokens=8))
        together = await backend.generate(requests)
    finally:
        handle.remove()
    assert max(sizes) <= 2 and len(sizes) > 8  # never more than two rows; the others waited their turn
    for request, completion in zip(requests, together, strict=True):
        (alone,) = await backend.generate([request])
        assert alone.token_ids == completion.token_ids


class _OneCall(GenerationBackend):
    """A backend with none of the optional capabilities: the protocol's defaults."""

    tokenizer = None
    max_context = 64

    def __init__(self, fail: bool = False, hold: bool = False) -> None:
        self.fail, self.hold, self.cancelled = fail, hold, False

    @property
    def policy_version(self) -> int:
        return 0

    async def generate(self, requests):
        if self.hold:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.fail:
            raise BackendError("the server went away")
        return [error_completion(r, "scripted", 0) for r in requests]


@pytest.mark.unit
async def test_a_backend_without_optional_capabilities_gets_the_protocol_s() -> None:
    """Declared in the protocol, never probed: not continuous, swaps between calls, no prefix
    cache, ready at once, weights as fetched, and ``submit`` = one generate call whose
    completions come as one; a failure reaches the caller, abandoning every request cancels it."""
    requests = [GenerationRequest(f"g/{i}", [1, 2], Sampling(), seed=i) for i in range(3)]
    backend = _OneCall()
    assert (backend.continuous, backend.update, backend.prefix_lookups) == (False, "between_batches", (0, 0))
    await backend.wait_ready()
    assert await backend.prepare_weights({"w": 1}) == {"w": 1}
    got = [(i, c.request_id) async for i, c in completions_as_done(backend, requests)]
    assert got == [(0, "g/0"), (1, "g/1"), (2, "g/2")]
    with pytest.raises(BackendError, match="went away"):
        [c async for c in completions_as_done(_OneCall(fail=True), requests)]
    held = _OneCall(hold=True)
    futures = held.submit(requests)
    await asyncio.sleep(0)
    for future in futures:
        future.cancel()
    await asyncio.sleep(0.01)
    assert held.cancelled
