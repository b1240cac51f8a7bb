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
    """What the generator stage needs of a backend."""

    tokenizer: Any
    max_context: int

    @property
    def policy_version(self) -> int:
        """Version of the weights that the next generate call will use."""
        ...

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Sample one completion per request, in request order. Recorded failures (prompt too
        long) come back as error completions; a broken backend raises BackendError."""
        ...

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
    """``(index in requests, completion)`` as each request finishes, from a backend that takes
    requests one by one (``submit``: one future per request); from any other, all at once after
    its ``generate``. Closing the iterator early cancels the requests not yet done."""
    submit = getattr(backend, "submit", None)
    if submit is None:
        for index, completion in enumerate(await backend.generate(requests)):
            yield index, completion
        return
    futures: list[asyncio.Future[Completion]] = submit(requests)
    index_of = {id(future): index for index, future in enumerate(futures)}
    try:
        pending = set(futures)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: index_of[id(f)]):
                yield index_of[id(future)], future.result()
    finally:
        for future in futures:
            future.cancel()
