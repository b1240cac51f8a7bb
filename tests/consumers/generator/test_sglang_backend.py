"""The SGLang backend against a fake server (httpx.MockTransport) that speaks the documented
native API shapes of SGLang 0.5.x (/work/shared/SGLANG_API.md). Never run against a live server.

The fake /generate returns deterministic tokens (prompt-dependent), ``meta_info`` with
``output_token_logprobs`` as [logprob, token_id, None] triples, ``finish_reason.type`` and
``weight_version``; /update_weights_from_disk checks that ``model_path`` holds a readable
safetensors file and answers ``success``/``message``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rollstream.config import SGLangConfig
from rollstream.consumers.generator.backends.base import GenerationRequest, Sampling
from rollstream.consumers.generator.backends.sglang import SGLangBackend
from rollstream.errors import BackendError

pytestmark = pytest.mark.unit


class FakeSGLang:
    """State and handlers of the fake server."""

    def __init__(self) -> None:
        self.generate_bodies: list[dict[str, Any]] = []
        self.update_bodies: list[dict[str, Any]] = []
        self.weight_version = "0"
        self.fail_next = 0  # answer this many requests with 503
        self.refuse_update = False
        self.in_flight = 0
        self.max_in_flight = 0
        self.loaded: dict[str, torch.Tensor] = {}
        self.calls: list[str] = []  # the control and update paths, in order
        self.generate_delay_s = 0.01

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health_generate":
            return httpx.Response(200, text="")
        if self.fail_next:
            self.fail_next -= 1
            return httpx.Response(503, text="overloaded")
        body = json.loads(request.content)
        if request.url.path == "/generate":
            return await self._generate(body)
        if request.url.path == "/update_weights_from_disk":
            self.calls.append(f"update:{self.in_flight}")
            return self._update(body)
        if request.url.path in ("/pause_generation", "/continue_generation"):
            self.calls.append(f"{request.url.path[1:]}:{body.get('mode', '')}")
            return httpx.Response(200, json={})
        return httpx.Response(404)

    async def _generate(self, body: dict[str, Any]) -> httpx.Response:
        self.generate_bodies.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.generate_delay_s)
        self.in_flight -= 1
        ids, params = body["input_ids"], body["sampling_params"]
        if ids[0] == 99:  # the fake's stand-in for a request the server rejects
            return httpx.Response(400, json={"error": {"message": "input is longer than the context"}})
        n = params["max_new_tokens"]
        stopped = ids[0] == 7 and n > 3  # the fake "hits a stop string" after 3 tokens for prompts starting 7
        tokens = [(ids[-1] + i) % 50 for i in range(3 if stopped else n)]
        entries = [[-0.1 * (i + 1), t, None] for i, t in enumerate(tokens)]
        entries[0][0] = -1e30  # SGLang clamps -inf to the dtype minimum; the client must bound it
        return httpx.Response(200, json={
            "text": " ".join(map(str, tokens)),
            "meta_info": {
                "id": body["rid"], "prompt_tokens": len(ids), "completion_tokens": len(tokens),
                "finish_reason": {"type": "stop", "matched": "END"} if stopped else {"type": "length", "length": n},
                "output_token_logprobs": entries, "weight_version": self.weight_version,
            },
        })

    def _update(self, body: dict[str, Any]) -> httpx.Response:
        from safetensors.torch import load_file

        self.update_bodies.append(body)
        if self.refuse_update:
            return httpx.Response(200, json={"success": False, "message": "shape mismatch", "num_paused_requests": 0})
        self.loaded = load_file(str(Path(body["model_path"]) / "model.safetensors"))
        self.weight_version = body["weight_version"]
        return httpx.Response(200, json={"success": True, "message": "Succeeded to update model weights.",
                                         "num_paused_requests": 0})


@pytest.fixture
def fake() -> FakeSGLang:
    return FakeSGLang()


def _backend(fake: FakeSGLang, tmp_path: Path, *, retries: int = 3, model_dir: str | None = None,
             update: str = "in_flight", **server: Any) -> SGLangBackend:
    config = SGLangConfig(url="http://sglang.test", weights_dir=str(tmp_path / "w"), **server)
    return SGLangBackend(config, tokenizer=None, context=128, model_dir=model_dir, retries=retries, update=update,
                         transport=httpx.MockTransport(fake.handle))


def _request(i: int, prompt: list[int], **sampling: Any) -> GenerationRequest:
    return GenerationRequest(f"g/{i}", prompt, Sampling(**sampling), seed=1000 + i)


async def test_generate_sends_documented_fields_and_parses_logprobs(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path)
    requests = [_request(0, [1, 2, 3], temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=5, stop=("END",)),
                _request(1, [7, 8], temperature=1.0, max_new_tokens=6)]
    first, second = await backend.generate(requests)
    body = fake.generate_bodies[0]
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True and body["logprob_start_len"] == -1
    assert body["rid"].startswith("g/0#")
    params = body["sampling_params"]
    assert params["temperature"] == 0.7 and params["top_p"] == 0.9 and params["top_k"] == -1
    assert params["max_new_tokens"] == 5 and params["stop"] == ["END"] and params["no_stop_trim"] is True
    assert params["sampling_seed"] == 1000
    assert first.token_ids == [3, 4, 5, 6, 7] and first.finish_reason == "length"
    assert first.logprobs[0] == -1e4 and first.logprobs[1:] == pytest.approx([-0.2, -0.3, -0.4, -0.5])
    assert first.logprob_temperature == 0.7 and first.text == "3 4 5 6 7"
    assert second.finish_reason == "stop" and len(second.token_ids) == len(second.logprobs) == 3
    await backend.aclose()


async def test_context_limits_and_server_refusals_are_recorded_failures(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path)
    too_long_locally = _request(0, list(range(128)))
    refused_by_server = _request(1, [99, 1, 2])
    capped = _request(2, list(range(120)), max_new_tokens=50)
    a, b, c = await backend.generate([too_long_locally, refused_by_server, capped])
    assert a.finish_reason == "error" and "too long" in (a.error or "")
    assert b.finish_reason == "error" and "refused" in (b.error or "")
    assert len(c.token_ids) == 8  # max_new_tokens cut to what the context leaves
    assert len(fake.generate_bodies) == 2  # the locally too-long prompt never went out
    await backend.aclose()


async def test_retries_5xx_then_gives_up_with_backend_error(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path, retries=2)
    fake.fail_next = 2
    (ok,) = await backend.generate([_request(0, [1, 2], max_new_tokens=2)])
    assert ok.token_ids == [2, 3]
    fake.fail_next = 10
    with pytest.raises(BackendError, match="after 3 attempts"):
        await backend.generate([_request(0, [1, 2], max_new_tokens=2)])
    await backend.aclose()


async def test_many_requests_in_flight_bounded_by_concurrency(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path, concurrency=5)
    out = await backend.generate([_request(i, [i + 1, 2], max_new_tokens=3) for i in range(40)])
    assert [c.request_id for c in out] == [f"g/{i}" for i in range(40)]  # request order kept
    assert 1 < fake.max_in_flight <= 5
    await backend.aclose()


async def test_weight_update_from_disk_writes_safetensors_and_versions(fake: FakeSGLang, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    backend = _backend(fake, tmp_path, model_dir=str(model_dir), abort_on_update=True, flush_cache=False)
    embed = torch.randn(10, 4, dtype=torch.bfloat16)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed}  # tied: aliased tensors
    await backend.load_weights(1, state)
    body = fake.update_bodies[-1]
    assert body["weight_version"] == "1" and body["abort_all_requests"] is True and body["flush_cache"] is False
    path = Path(body["model_path"])
    assert path.name == "v00000001" and (path / "config.json").exists()
    assert torch.equal(fake.loaded["lm_head.weight"], embed)
    assert backend.policy_version == 1
    (after,) = await backend.generate([_request(0, [1, 2], max_new_tokens=2)])
    assert after.policy_version_first == after.policy_version_last == 1
    await backend.load_weights(2, state)
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v00000002"]  # old versions pruned
    await backend.aclose()


async def test_refused_update_keeps_the_old_version(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path)
    fake.refuse_update = True
    with pytest.raises(BackendError, match="shape mismatch"):
        await backend.load_weights(4, {"w": torch.ones(2)})
    assert backend.policy_version == 0 and fake.update_bodies[-1]["flush_cache"] is False  # in flight: no flush

    assert await backend.health()
    await backend.aclose()


async def test_unreachable_server_is_a_backend_error(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    backend = SGLangBackend(SGLangConfig(url="http://sglang.test", weights_dir=str(tmp_path)), None, context=64,
                            retries=1, transport=httpx.MockTransport(refuse))
    assert not await backend.health()
    with pytest.raises(BackendError, match="ConnectError"):
        await backend.generate([_request(0, [1, 2])])
    with pytest.raises(BackendError):
        await backend.wait_ready(timeout_s=0.2, poll_s=0.05)
    await backend.aclose()


async def test_overlapping_calls_are_all_in_flight_at_the_server(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path)
    assert backend.continuous
    calls = [backend.generate([_request(10 * b + i, [b + 1, i], max_new_tokens=2) for i in range(3)])
             for b in range(4)]
    await asyncio.gather(*calls)
    assert fake.max_in_flight == 12  # four batches of three at once, not one batch at a time
    await backend.aclose()


async def test_in_flight_update_pauses_in_place_and_requests_finish_under_the_new_version(
        fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path)
    fake.generate_delay_s = 0.3
    running = asyncio.create_task(backend.generate([_request(0, [1, 2], max_new_tokens=2)]))
    while not fake.in_flight:
        await asyncio.sleep(0.005)
    await backend.load_weights(1, {"w": torch.ones(2)})
    assert not running.done()  # the update did not wait for the request in flight
    assert fake.calls == ["pause_generation:in_place", "update:1", "continue_generation:"]
    assert fake.update_bodies[-1]["flush_cache"] is False and fake.update_bodies[-1]["abort_all_requests"] is False
    (done,) = await running
    assert done.policy_version_first == 0 and done.policy_version_last == 1
    await backend.aclose()


async def test_between_batches_update_waits_for_the_calls_in_flight(fake: FakeSGLang, tmp_path: Path) -> None:
    backend = _backend(fake, tmp_path, update="between_batches")
    fake.generate_delay_s = 0.2
    running = asyncio.create_task(backend.generate([_request(0, [1, 2], max_new_tokens=2)]))
    while not fake.in_flight:
        await asyncio.sleep(0.005)
    update = asyncio.create_task(backend.load_weights(1, {"w": torch.ones(2)}))
    while backend._open.is_set():  # the update is holding new calls while it waits for the one in flight
        await asyncio.sleep(0.001)
    late = asyncio.create_task(backend.generate([_request(1, [3, 4], max_new_tokens=2)]))
    (first,) = await running
    await update
    (second,) = await late
    assert fake.calls == ["update:0"]  # no pause; nothing in flight when it loaded
    assert first.policy_version_first == first.policy_version_last == 0
    assert second.policy_version_first == second.policy_version_last == 1  # held until the update was done
    await backend.aclose()
