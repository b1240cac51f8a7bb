"""Episodes played against a fixed policy: generation and the sandbox, by the executor's rules.

Consumes (task, sample index) pairs; produces one :class:`SampleResult` per sample. Each sample
is an episode of up to ``turns`` turns played exactly as a training episode is: its prompt is
rendered as the generator renders it (the sampler's system prompt, the model's chat template),
its code is scored by the executor's reward rules in the sandbox with the task's reference
checked (``consumers/executor/score.py``, ``reference.py``), and whether it continues, with what
observation, and whether it passed is decided by the executor's own rule
(``consumers/executor/episodes.py``: :func:`decide`; a chain passes when every step did). Used by
``rollstream eval`` and by the evaluator stage, so that the three agree on what "passed" means.

Generation is deterministic given ``seed``: turn 1 of sample i of task t uses
``derive_seed(seed, t, i)``, turn n > 1 ``derive_seed(seed, f"{t}#{n}", i)``. Batches of
``batch`` requests are generated in turn; each batch is scored in the sandbox pool while the
next one generates.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rollstream.config import Config
from rollstream.tasks import domain_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleResult:
    """One sample's episode: its verdict and how far its last turn got (format apart from
    correctness: a code block, code that parses, code that ran without an error)."""

    task_id: str
    family: str
    sample_index: int
    passed: bool
    reward: float
    error_kind: str
    finish_reason: str
    completion_tokens: int
    has_code: bool = True
    parses: bool = True
    ran: bool = True
    turns: int = 1
    completion: str = ""
    domain: str = "code"  # rollstream.tasks.domain_of the task's reward kind


def eval_spec(task: Any, tests: str) -> Any:
    """The spec a task's samples are scored by: the one its prompts carry in training (with its
    reference, checked as the executor checks it), the tests ``tests`` names (visible, heldout,
    all: both; a task without held-out tests keeps its visible ones)."""
    spec = task.issued_reward()
    chosen = {"visible": list(spec.tests), "heldout": list(task.heldout_tests),
              "all": list(spec.tests) + list(task.heldout_tests)}[tests] or list(spec.tests)
    return msgspec.structs.replace(spec, tests=chosen)


def messages_of(config: Config, task: Any) -> list[Any]:
    """The task's chat as the sampler issues it (its system prompt first, when set)."""
    from rollstream.schemas.events import Message

    messages = task.chat()
    if config.sampler.system_prompt and not any(m.role == "system" for m in messages):
        messages = [Message(role="system", content=config.sampler.system_prompt), *messages]
    return messages


@dataclass
class _Episode:
    task: Any
    index: int
    spec: Any
    request: Any  # the GenerationRequest of its next turn
    turn: int = 1
    subtask_index: int = 0
    carried_code: str = ""


class Player:
    """Plays episodes on ``backend`` (a generation backend holding the policy) and ``pool`` (a
    sandbox backend), by ``config``'s generator sampling and executor rules."""

    def __init__(self, config: Config, backend: Any, pool: Any, *, seed: int, turns: int, tests: str = "all",
                 batch: int = 8, registry: Any = None, references: Any = None) -> None:
        from rollstream.consumers.executor.reference import ReferenceChecks
        from rollstream.consumers.executor.rewards import default_registry

        self.config, self.backend, self.pool = config, backend, pool
        self.seed, self.turns, self.tests, self.batch = seed, turns, tests, batch
        self.registry = registry if registry is not None else default_registry()
        self.references = references if references is not None else ReferenceChecks(pool)
        self.gate = asyncio.Semaphore(config.executor.concurrency)
        self.tokens = 0
        self.prompts: dict[str, list[int]] = {}

    def _first(self, task: Any, index: int) -> _Episode:
        from rollstream.consumers.generator.backends.base import GenerationRequest
        from rollstream.consumers.generator.backends.sampling import derive_seed
        from rollstream.consumers.generator.chat import chat_prompt_ids
        from rollstream.consumers.generator.stage import resolve_sampling
        from rollstream.schemas.events import SamplingParams

        if task.task_id not in self.prompts:
            messages = [msgspec.structs.asdict(m) for m in messages_of(self.config, task)]
            self.prompts[task.task_id] = chat_prompt_ids(self.backend.tokenizer, messages)
        sampling = resolve_sampling(self.config.generator, task.sampling or SamplingParams())
        request = GenerationRequest(f"{task.task_id}/{index}", self.prompts[task.task_id], sampling,
                                    derive_seed(self.seed, task.task_id, index), task_id=task.task_id)
        return _Episode(task, index, eval_spec(task, self.tests), request)

    async def play(self, samples: Sequence[tuple[Any, int]],
                   on_result: Callable[[SampleResult], None] | None = None) -> list[SampleResult]:
        """Every (task, sample index) of ``samples`` played to its end; results in no set order."""
        episodes = sorted((self._first(t, i) for t, i in samples), key=lambda e: len(e.request.prompt_token_ids))
        results: list[SampleResult] = []
        started = time.monotonic()
        turn = 1
        while episodes:
            scoring, going_on = [], []
            for start in range(0, len(episodes), self.batch):
                chunk = episodes[start:start + self.batch]
                completions = await self.backend.generate([e.request for e in chunk])
                self.tokens += sum(len(c.token_ids) for c in completions)
                scoring += [asyncio.create_task(self._score(e, c)) for e, c in zip(chunk, completions)]
                log.info("turn %d: generated %d/%d (%.0f tok/s)", turn, start + len(chunk), len(episodes),
                         self.tokens / max(time.monotonic() - started, 1e-9))
            for outcome in await asyncio.gather(*scoring):
                if isinstance(outcome, SampleResult):
                    results.append(outcome)
                    if on_result is not None:
                        on_result(outcome)
                else:
                    going_on.append(outcome)
            episodes, turn = going_on, turn + 1
        return results

    async def _score(self, episode: _Episode, completion: Any) -> SampleResult | _Episode:
        """Score one turn; the episode's result when it ends, else the episode at its next turn."""
        from rollstream.consumers.executor.episodes import Turn, decide, turn_spec
        from rollstream.consumers.executor.rewards import extract_code
        from rollstream.consumers.executor.score import evaluate

        spec, text = episode.spec, completion.text
        stepped = turn_spec(spec, episode.subtask_index, episode.carried_code, text)
        scored_spec, scored_text = stepped if stepped is not None else (spec, text)
        async with self.gate:
            evaluation = await evaluate(self.pool, self.registry, scored_spec, scored_text,
                                        f"eval-{episode.request.request_id}-{episode.turn}",
                                        references=self.references, task_id=episode.task.task_id)
        execution = evaluation.scored.execution
        state = Turn(episode.turn, self.turns, episode.subtask_index, episode.carried_code, completion.error is None)
        events = evaluation.result.events if evaluation.result else []
        outcome = decide(spec, state, text, evaluation.scored.reward, execution, events)
        if outcome.ends:
            code = extract_code(text).code
            return SampleResult(
                episode.task.task_id, episode.task.family, episode.index, outcome.passed, outcome.reward,
                execution.error_kind, completion.finish_reason, len(completion.token_ids),
                has_code=code is not None, parses=code is not None and execution.error_kind not in ("syntax", "compile_error"),
                ran=execution.error_kind == "none", turns=episode.turn, completion=text,
                domain=domain_of(episode.task.reward.kind))
        return self._next(episode, completion, outcome)

    def _next(self, episode: _Episode, completion: Any, outcome: Any) -> _Episode:
        from rollstream.consumers.generator.backends.base import GenerationRequest
        from rollstream.consumers.generator.backends.sampling import derive_seed
        from rollstream.consumers.generator.turns import observation_ids

        request = episode.request
        context = [*request.prompt_token_ids, *completion.token_ids]
        context += observation_ids(self.backend.tokenizer, outcome.observation, completion.token_ids)
        turn = episode.turn + 1
        seed = derive_seed(self.seed, f"{episode.task.task_id}#{turn}", episode.index)
        episode.request = GenerationRequest(request.request_id, context, request.sampling, seed,
                                            task_id=episode.task.task_id, turn=turn, subtask=outcome.subtask_index)
        episode.turn, episode.subtask_index, episode.carried_code = turn, outcome.subtask_index, outcome.carried_code
        return episode
