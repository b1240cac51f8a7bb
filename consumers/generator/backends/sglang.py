"""The SGLang backend: a client of a running SGLang server's native HTTP API.

Written against SGLang 0.5.x (the field lists of ``io_struct.py`` in the 0.5.3+ sources and
``docs/advanced_features/sglang_for_rl.md``; see /work/shared/SGLANG_API.md). It has only been
run against a fake server that speaks those documented shapes (tests/consumers/
test_sglang_backend.py), never against a live SGLang server.

* ``POST /generate`` per request, many in flight (bounded by ``concurrency``), with
  ``input_ids`` (the tokens the learner will see), ``return_logprob`` and
  ``logprob_start_len=-1`` (log-probs of output tokens only). Completion token ids and
  log-probs come from ``meta_info.output_token_logprobs`` ([logprob, token_id, text]).
* Log-probs: SGLang returns log-probs of the temperature-scaled distribution, not
  renormalised after top-p/top-k (unless the server runs with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB``, then temperature 1: pass ``original_logprobs=True``).
  ``logprob_temperature`` is set accordingly. Greedy requests are scored at temperature 1.
* Weight updates: the state dict is written as safetensors (plus ``config.json`` when a
  model directory is known) under ``weights_dir/v{version}``, then
  ``POST /update_weights_from_disk`` with ``weight_version``. That directory must be readable
  by the server at the same path (same host or a shared volume). With a file weight store
  (``weights.store`` a directory or URL, rollstream/weight_files.py) the version's own directory
  is passed as it is when it is on the local filesystem, or its files are copied under
  ``weights_dir`` (object storage): nothing is re-serialised.
* Fed concurrently: generate calls overlap (``continuous``: the generator stage keeps batches in
  flight up to ``generator.max_rows``), so the server's own continuous batching sees many requests
  at once, not one batch at a time.
* ``generator.update = "in_flight"``: a weight update pauses the server's running requests in
  place (``POST /pause_generation`` ``{"mode": "in_place"}``), loads the new weights without a cache
  flush (a flush fails after an in-place pause) and continues them (``/continue_generation``):
  requests in progress finish under the new weights, and ``meta_info.weight_version`` gives their
  last version. ``"between_batches"``: new calls wait while the update waits for the calls in
  flight to end. ``abort_on_update`` instead aborts the requests in flight (finish reason "abort").
* Health: ``GET /health_generate``.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from rollstream.config import SGLangConfig
from rollstream.consumers.generator.backends.base import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    error_completion,
    prompt_too_long,
)
from rollstream.errors import BackendError, converted
from rollstream.retry import retry

FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
MIN_LOGPROB = -1e4  # the schema's floor; SGLang clamps -inf to the dtype's minimum


class SGLangBackend(GenerationBackend):
    """See the module docstring. ``transport`` lets tests inject an ``httpx.MockTransport``."""

    continuous = True  # overlapping generate calls: the server batches them continuously

    def __init__(self, server: SGLangConfig, tokenizer: Any, *, context: int, model_dir: str | None = None,
                 retries: int = 3, send_seed: bool = True, original_logprobs: bool = False, policy_version: int = 0,
                 update: str = "in_flight", transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_context = context
        self._client = httpx.AsyncClient(base_url=server.url.rstrip("/"), timeout=server.timeout_s,
                                         transport=transport)
        self._weights_dir = Path(server.weights_dir)
        self._model_dir = Path(model_dir) if model_dir else None
        self._abort_all_requests = server.abort_on_update
        self._flush_cache = server.flush_cache
        self._semaphore = asyncio.Semaphore(server.concurrency)
        self._retries = retries
        self._send_seed = send_seed
        self._original_logprobs = original_logprobs
        self._version = policy_version
        self.update = update
        self._swap = asyncio.Lock()  # one weight update at a time
        self._calls = 0  # generate calls in flight
        self._drained = asyncio.Event()  # no generate call in flight
        self._drained.set()
        self._open = asyncio.Event()  # cleared while a between-batches update waits: new calls wait too
        self._open.set()

    @property
    def policy_version(self) -> int:
        return self._version

    async def health(self) -> bool:
        try:
            response = await self._client.get("/health_generate")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 1.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await self.health():
            if asyncio.get_running_loop().time() > deadline:
                raise BackendError(f"SGLang server at {self._client.base_url} not healthy after {timeout_s:.0f}s")
            await asyncio.sleep(poll_s)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        await self._open.wait()
        self._calls += 1
        self._drained.clear()
        try:
            return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))
        finally:
            self._calls -= 1
            if not self._calls:
                self._drained.set()

    def _payload(self, request: GenerationRequest) -> dict[str, Any]:
        s = request.sampling
        params: dict[str, Any] = {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k if s.top_k > 0 else -1,  # SGLang: -1 = off
            "max_new_tokens": min(s.max_new_tokens, self.max_context - len(request.prompt_token_ids)),
            "skip_special_tokens": True,
            "no_stop_trim": True,  # keep the stop string in the text, as the transformers backend does
        }
        if s.stop:
            params["stop"] = list(s.stop)
        if self._send_seed:
            params["sampling_seed"] = request.seed % (2**31)
        return {
            "input_ids": request.prompt_token_ids,
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,
            "rid": f"{request.request_id}#{uuid.uuid4().hex[:8]}",  # unique per attempt
        }

    async def _generate_one(self, request: GenerationRequest) -> Completion:
        version = self._version
        problem = prompt_too_long(request, self.max_context)
        if problem:
            return error_completion(request, problem, version)
        async with self._semaphore:
            response = await self._post("/generate", self._payload(request))
        if response.status_code == 400:  # the server refused this request (e.g. too long): a recorded failure
            return error_completion(request, f"SGLang refused the request: {response.text[:500]}", version)
        try:
            return self._parse(request, response.json(), version)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise BackendError(f"unexpected /generate response for {request.request_id}: {exc}") from exc

    def _parse(self, request: GenerationRequest, body: Any, version: int) -> Completion:
        if isinstance(body, list):  # a single request may come back as a one-element batch
            body = body[0]
        meta = body["meta_info"]
        entries = meta["output_token_logprobs"]  # [[logprob, token_id, text-or-None], ...]
        tokens = [int(e[1]) for e in entries]
        logprobs = [max(MIN_LOGPROB, min(0.0, float(e[0]))) for e in entries]
        finish = meta.get("finish_reason") or {}
        reason = FINISH.get(finish.get("type") if isinstance(finish, dict) else str(finish), "length")
        served = meta.get("weight_version")
        last = int(served) if isinstance(served, (int, str)) and str(served).isdigit() else version
        temperature = request.sampling.temperature
        return Completion(
            request_id=request.request_id,
            token_ids=tokens,
            logprobs=logprobs,
            text=body["text"],
            finish_reason=reason,  # type: ignore[arg-type]
            logprob_temperature=1.0 if self._original_logprobs or temperature <= 0 else temperature,
            policy_version_first=version,
            policy_version_last=last,
        )

    async def _post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        """POST, retried with backoff on transport errors and 5xx (``retries`` times); 4xx is an answer."""

        async def post_once() -> httpx.Response:
            with converted(f"POST {path}", into=BackendError):
                response = await self._client.post(path, json=payload)
            if response.status_code >= 500:
                raise BackendError(f"POST {path} failed: HTTP {response.status_code}: {response.text[:300]}")
            return response

        attempts = self._retries + 1
        try:
            return await retry(post_once, what=f"SGLang {path}", retry_on=(BackendError,), attempts=attempts,
                               first_delay_s=0.5, max_delay_s=10.0)
        except BackendError as exc:
            base = self._client.base_url
            raise BackendError(f"SGLang at {base}: gave up after {attempts} attempts: {exc}") from exc

    async def load_weights(self, version: int, state_dict: Mapping[str, Any]) -> None:
        async with self._swap:
            path = await asyncio.to_thread(self._checkpoint_of, version, state_dict)
            if self._abort_all_requests:  # the requests in flight end now, as "abort"
                await self._update_from(path, version, flush_cache=self._flush_cache)
            elif self.update == "in_flight":
                await self._post("/pause_generation", {"mode": "in_place"})
                try:
                    await self._update_from(path, version, flush_cache=False)  # a flush fails after in_place
                finally:
                    await self._post("/continue_generation", {})
            else:
                self._open.clear()
                try:
                    await self._drained.wait()
                    await self._update_from(path, version, flush_cache=self._flush_cache)
                finally:
                    self._open.set()
            if getattr(state_dict, "local_dir", None) is None:  # not a directory of the weight store itself
                await asyncio.to_thread(self._prune, path)

    async def _update_from(self, path: Path, version: int, *, flush_cache: bool) -> None:
        body: dict[str, Any] = {
            "model_path": str(path),
            "weight_version": str(version),
            "abort_all_requests": self._abort_all_requests,
        }
        if not flush_cache:  # sent only when not the default: older 0.5 releases lack the field
            body["flush_cache"] = False
        response = await self._post("/update_weights_from_disk", body)
        try:
            result = response.json()
        except ValueError:
            result = {"success": False, "message": response.text[:500]}
        if response.status_code != 200 or not result.get("success", False):
            raise BackendError(f"SGLang refused weights v{version}: {result.get('message', '')}")
        self._version = version

    def _checkpoint_of(self, version: int, state_dict: Mapping[str, Any]) -> Path:
        """The directory the server loads: a file weight store's version directory as it is when
        it is on this host's filesystem (weights.store; the server must read the same path), its
        files copied here when it is elsewhere (object storage), else the tensors written here."""
        local = getattr(state_dict, "local_dir", None)
        if local is not None:
            return Path(local)
        download = getattr(state_dict, "download_to", None)
        if download is not None:
            path = self._weights_dir / f"v{version:08d}"
            shutil.rmtree(path, ignore_errors=True)
            return Path(download(str(path)))
        return self._write_checkpoint(version, state_dict)

    def _write_checkpoint(self, version: int, state_dict: Mapping[str, Any]) -> Path:
        from safetensors.torch import save_file

        path = self._weights_dir / f"v{version:08d}"
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        # safetensors refuses aliased tensors (tied embeddings): give each its own storage.
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
        save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt", "version": str(version)})
        if self._model_dir and (self._model_dir / "config.json").is_file():
            shutil.copy(self._model_dir / "config.json", partial / "config.json")
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)  # the server only ever sees a complete directory
        return path

    def _prune(self, keep: Path) -> None:
        for old in self._weights_dir.glob("v*"):
            if old != keep and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)

    async def aclose(self) -> None:
        await self._client.aclose()
