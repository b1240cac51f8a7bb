"""The generation backend interface and the plain values that cross it.

A backend turns prompt token ids into sampled completions with the behaviour log-prob of
every sampled token, and swaps its weights when told to. It never sees Kafka; the stage
(``consumers/generator/stage.py``) does the I/O around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """Resolved sampling settings of one request (config defaults with the prompt's overrides)."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One completion to sample. ``request_id`` is the rollout id ("group_id/sample_index")."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    seed: int
    task_id: str = ""  # the task the prompt came from (the scripted backend answers by it)
    turn: int = 1  # a multi-turn episode's turn (the scripted backend answers by it too)
    subtask: int = 0  # a subtask chain's step (and by this)
    more_turns: bool = False  # a next turn of this sample may follow (turn < the episode's max_turns)


@dataclass(frozen=True, slots=True)
class Completion:
    """One sampled completion.

    ``logprobs[i]`` = log mu(token_ids[i] | prompt, token_ids[:i]) under the distribution the
    token was drawn from; ``logprob_temperature`` is the temperature applied to the logits
    for it (see docs/generator.md for what each backend includes). ``text`` equals
    ``tokenizer.decode(token_ids, skip_special_tokens=True)`` for the transformers backend.
    ``error`` is set (and ``finish_reason`` is "error", no tokens) when no completion could be
    made, e.g. the prompt does not fit the model's context.
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    logprob_temperature: float
    policy_version_first: int
    policy_version_last: int
    error: str | None = None
    first_token_at: float | None = None  # time.time() when its first token was sampled
    extra: dict[str, Any] = field(default_factory=dict)


class GenerationBackend(Protocol):
    """What the generator stage needs of a backend. Backends subclass it: the optional capabilities
    below are declared here with what a backend without them does, and a backend that has one
    overrides it (the stage never probes for an attribute)."""

    tokenizer: Any
    max_context: int
    continuous: bool = False
    """Overlapping generate calls share one batch (the stage keeps several in flight)."""
    update: Literal["in_flight", "between_batches"] = "between_batches"
    """When a weight swap lands: between two steps of running requests, or between generate calls."""

    @property
    def policy_version(self) -> int:
        """Version of the weights that the next generate call will use."""
        ...

    @property
    def prefix_lookups(self) -> tuple[int, int]:
        """(hits, misses) of the backend's prefix cache so far; (0, 0) without one."""
        return 0, 0

    async def wait_ready(self) -> None:
        """Return once the backend can generate (a server that is still starting); at once here."""
        return None

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Sample one completion per request, in request order. Recorded failures (prompt too
        long) come back as error completions; a broken backend raises BackendError."""
        ...

    def submit(self, requests: Sequence[GenerationRequest]) -> list[asyncio.Future[Completion]]:
        """One future per request, done as its completion is. Here: all of them when one generate
        call over them returns (a backend that finishes rows one by one overrides it); cancelling
        every future cancels the call."""
        call = asyncio.ensure_future(self.generate(requests))
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Completion]] = [loop.create_future() for _ in requests]

        def settle(done: asyncio.Future[list[Completion]]) -> None:
            failed = None if done.cancelled() else done.exception()
            for index, future in enumerate(futures):
                if future.done():
                    continue
                if done.cancelled():
                    future.cancel()
                elif failed is not None:
                    future.set_exception(failed)
                else:
                    future.set_result(done.result()[index])

        def abandoned(_: asyncio.Future[Completion]) -> None:
            if not call.done() and all(future.cancelled() for future in futures):
                call.cancel()

        call.add_done_callback(settle)
        for future in futures:
            future.add_done_callback(abandoned)
        return futures

    async def prepare_weights(self, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check and convert a fetched state dict for ``load_weights`` off the swap's critical path
        (a BackendError: it does not fit the model); as it is here."""
        return state_dict

    async def load_weights(self, version: int, state_dict: Mapping[str, Any]) -> None:
        """Swap to ``state_dict`` (all of it or nothing) between generate calls."""
        ...

    async def aclose(self) -> None: ...


def error_completion(request: GenerationRequest, message: str, version: int) -> Completion:
    return Completion(
        request_id=request.request_id,
        token_ids=[],
        logprobs=[],
        text="",
        finish_reason="error",
        logprob_temperature=request.sampling.temperature or 1.0,
        policy_version_first=version,
        policy_version_last=version,
        error=message[:4096],
    )


def prompt_too_long(request: GenerationRequest, max_context: int) -> str | None:
    """The error message when the prompt leaves no room for a single completion token."""
    n = len(request.prompt_token_ids)
    if n == 0:
        return "empty prompt"
    if n >= max_context:
        return f"prompt too long: {n} tokens, model context is {max_context}"
    return None


async def completions_as_done(backend: GenerationBackend, requests: Sequence[GenerationRequest]
                              ) -> AsyncIterator[tuple[int, Completion]]:
    """``(index in requests, completion)`` as each request finishes (the backend's ``submit``).
    Closing the iterator early cancels the requests not yet done."""
    futures = backend.submit(requests)
    index_of = {id(future): index for index, future in enumerate(futures)}
    try:
        pending = set(futures)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: index_of[id(f)]):
                yield index_of[id(future)], future.result()
    finally:
        for future in futures:
            if not future.cancel() and not future.cancelled():
                future.exception()  # retrieved: one failure reaches the caller once, never a "never retrieved" log
