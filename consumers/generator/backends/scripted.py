"""A generation backend without a model, for tests and pipeline debugging: each sample is one of
its task's scripted answers, so rewards vary within a group as they do with a real policy.

A task's answers, in order: its ``reference_solution``, the built-in suite's wrong solution for
it (:func:`rollstream.tasks.sources.wrong_solutions`), and the lines of ``generator.backend.answers``
for it. Sample ``i`` of a group gets answer ``i mod n`` (at turn ``t`` of an episode, ``i + t - 1 mod n``: a
sample that failed moves on to the next answer), as a fenced Python block; a task with
no answers gets an empty completion. The text is tokenized with the configured model's
tokenizer (cut at ``max_new_tokens``, finish reason ``length``), each token with log-prob
``LOGPROB``, so every stage downstream (the learner included) does its real work. Weights are
accepted and only their version is kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rollstream.consumers.generator.backends.base import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    error_completion,
    prompt_too_long,
)
from rollstream.consumers.generator.backends.continuous import ContinuousBackend, UpdateMode
from rollstream.errors import ConfigError

LOGPROB = -0.25
CACHE_ENTRIES = 1 << 14  # encoded answers and decoded completions kept (least recently used dropped first)


def task_answers(config: Any) -> dict[str, list[str]]:
    """task id -> its scripted answers (see the module doc)."""
    from rollstream.tasks.sources import load_tasks, wrong_solutions

    answers: dict[str, list[str]] = {}
    for task in load_tasks(config.sampler.sources):
        answers[task.task_id] = [task.reference_solution] if task.reference_solution else []
        for step, subtask in enumerate(task.reward.subtasks):  # a chain: each step's own answers
            if subtask.reference:
                answers[f"{task.task_id}#{step}"] = [subtask.reference]
    for task_id, text in wrong_solutions().items():
        if task_id in answers:
            answers[task_id].append(text)
    extra = getattr(config.generator.backend, "answers", "")  # kind = "scripted"
    if extra:
        _add_answers(answers, Path(extra))
    return answers


def _add_answers(answers: dict[str, list[str]], path: Path) -> None:
    """The lines of a ``generator.backend.answers`` file, each appended to its task's answers."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"generator.backend.answers: cannot read {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            task_id, text = item["task_id"], item.get("completion")
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: expected {{\"task_id\", \"completion\"}}: {exc}") from exc
        if task_id in answers and isinstance(text, str):
            answers[task_id].append(text)


class ScriptedBackend(GenerationBackend):
    def __init__(self, tokenizer: Any, answers: Mapping[str, list[str]], max_context: int, eos_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.answers = answers
        self.max_context = max_context
        self.eos_id = eos_id
        self._version = 0
        self._encode = functools.lru_cache(maxsize=CACHE_ENTRIES)(self._encode_text)
        self._decode = functools.lru_cache(maxsize=CACHE_ENTRIES)(self._decode_ids)

    @classmethod
    def load(cls, config: Any) -> ScriptedBackend:
        from rollstream.consumers.generator.chat import max_context
        from rollstream.models import load_model_config, load_tokenizer

        spec = config.generator.model
        tokenizer = load_tokenizer(spec)
        return cls(tokenizer, task_answers(config), max_context(load_model_config(spec)), tokenizer.eos_token_id)

    @property
    def policy_version(self) -> int:
        return self._version

    def answer(self, request: GenerationRequest) -> str:
        answers = self.answers.get(f"{request.task_id}#{request.subtask}") or self.answers.get(request.task_id) or [""]
        index = int(request.request_id.rsplit("/", 1)[-1]) if "/" in request.request_id else 0
        text = answers[(index + request.turn - 1) % len(answers)]
        return f"```python\n{text.rstrip()}\n```" if text else ""

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [self.complete(request) for request in requests]

    def complete(self, request: GenerationRequest) -> Completion:
        error = prompt_too_long(request, self.max_context)
        if error is not None:
            return error_completion(request, error, self._version)
        ids, finish = self.shape(request, self.encoded(self.answer(request)))
        return Completion(
            request_id=request.request_id, token_ids=ids, logprobs=[LOGPROB] * len(ids),
            text=self.decoded(ids), finish_reason=finish,
            logprob_temperature=request.sampling.temperature or 1.0, policy_version_first=self._version,
            policy_version_last=self._version)

    def encoded(self, text: str) -> list[int]:
        """The token ids of an answer (a task has a few: each is encoded once)."""
        return list(self._encode(text))

    def _encode_text(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False)) if text else ()

    def decoded(self, ids: list[int]) -> str:
        """The text of ``ids`` (completions repeat: an answer cut or stretched to a few hundred lengths)."""
        return self._decode(tuple(ids))

    def _decode_ids(self, ids: tuple[int, ...]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def shape(self, request: GenerationRequest, ids: list[int]) -> tuple[list[int], str]:
        """The answer's token ids as the completion (cut to fit, or ended with EOS) and its finish reason."""
        room = min(request.sampling.max_new_tokens, self.max_context - len(request.prompt_token_ids))
        if len(ids) + (self.eos_id is not None) > room:
            return ids[:room], "length"
        return ids + ([self.eos_id] if self.eos_id is not None else []), "stop"

    async def load_weights(self, version: int, state_dict: Mapping[str, Any]) -> None:
        self._version = version

    async def aclose(self) -> None:
        return None


class SimBackend(ScriptedBackend):
    """``generator.backend = "sim"``: a GPU deployment's lengths and costs, without a model.

    Each completion is its scripted answer (as above) stretched or cut to a length drawn from a
    log-normal around ``generator.backend.mean_tokens`` (spread ``sigma``: a long tail), seeded by the
    request's seed, at most ``max_new_tokens``: shorter than the answer, it is cut (finish reason
    ``length``, and its code usually no longer compiles, as with a real model); longer, filler
    tokens follow the answer's closed code block (the reward reads only the block). A generate call
    sleeps ``base_s + per_token_s * longest completion of the call``.
    """

    def __init__(self, tokenizer: Any, answers: Mapping[str, list[str]], max_context: int, eos_id: int | None,
                 sim: Any) -> None:
        super().__init__(tokenizer, answers, max_context, eos_id)
        self.sim = sim
        filler = list(tokenizer.encode("\nThe function above does it.", add_special_tokens=False))
        self.filler = filler or [eos_id or 0]

    @classmethod
    def load(cls, config: Any) -> SimBackend:
        base = ScriptedBackend.load(config)
        return cls(base.tokenizer, base.answers, base.max_context, base.eos_id, config.generator.backend)

    def length(self, request: GenerationRequest) -> int:
        import math
        import random

        rng = random.Random(request.seed)
        drawn = self.sim.mean_tokens * math.exp(self.sim.sigma * rng.gauss(0.0, 1.0))
        room = min(request.sampling.max_new_tokens, self.max_context - len(request.prompt_token_ids))
        return max(1, min(room, round(drawn)))

    def shape(self, request: GenerationRequest, ids: list[int]) -> tuple[list[int], str]:
        target = self.length(request)
        if len(ids) > target:
            return ids[:target], "length"
        while len(ids) < target:
            ids = ids + self.filler[: target - len(ids)]
        return ids, "stop"

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = await super().generate(requests)
        cost = self.sim.base_s + self.sim.per_token_s * max((len(c.token_ids) for c in out), default=0)
        if cost > 0:
            await asyncio.sleep(cost)
        return out


@dataclasses.dataclass
class SimRow:
    """A simulated row: its whole completion is known; it "samples" one token per iteration."""

    done: Completion
    produced: int = 0
    version_first: int | None = None
    version_last: int | None = None
    abandoned: bool = False


class SimLoop:
    """The bookkeeping of a decode loop without a model (backends/continuous.py drives it)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows: list[SimRow] = []

    def __len__(self) -> int:
        return len(self.rows)

    def fits(self, rows: Sequence[SimRow]) -> bool:
        return len(self.rows) + len(rows) <= max(1, self.max_rows)

    def admit(self, rows: Sequence[SimRow]) -> None:
        self.rows = self.rows + list(rows)

    def step(self, version: int) -> list[SimRow]:
        left: list[SimRow] = []
        keep: list[SimRow] = []
        for row in self.rows:
            if not row.abandoned:
                row.produced += 1
                row.version_last = version
                if row.version_first is None:
                    row.version_first = version
            (left if row.abandoned or row.produced >= len(row.done.token_ids) else keep).append(row)
        self.rows = keep
        return left

    def abandon(self) -> list[SimRow]:
        rows, self.rows = self.rows, []
        return rows


class SimDecodeBackend(ContinuousBackend):
    """``generator.backend = "sim"`` with a per-forward cost (``generator.backend.per_forward_s``/``per_row_s``): the
    sim's completions (:class:`SimBackend`), produced by a simulated continuous decode loop whose
    iteration sleeps ``per_forward_s + per_row_s x rows in the loop`` (and a prefill forward of the
    same form for the rows that join), one token per row per iteration. The cost model of a GPU
    decode step: a fixed part (weights read once per forward, kernel launches) and a part per row;
    batching well is what makes a token cheap, as on real hardware. With ``generator.continuous =
    false`` the stage gives it one batch at a time, and the same model prices today's batching."""

    def __init__(self, script: SimBackend, *, max_rows: int = 64, update: UpdateMode = "in_flight") -> None:
        super().__init__(update=update)
        self.script = script
        self.tokenizer = script.tokenizer
        self.max_context = script.max_context
        self.loop = SimLoop(max_rows)
        self.forwards = 0

    @classmethod
    def load(cls, config: Any) -> SimDecodeBackend:
        gen = config.generator
        return cls(SimBackend.load(config), max_rows=gen.max_rows, update=gen.update)

    def new_row(self, request: GenerationRequest) -> SimRow:
        return SimRow(self.script.complete(request))

    def completion(self, row: SimRow) -> Completion:
        version = self._version
        return dataclasses.replace(row.done, policy_version_first=version if row.version_first is None
                                   else row.version_first,
                                   policy_version_last=version if row.version_last is None else row.version_last)

    async def iterate(self, admit: list[SimRow], version: int) -> list[SimRow]:
        sim = self.script.sim
        cost = 0.0
        if admit:
            self.loop.admit(admit)
            cost += sim.per_forward_s + sim.per_row_s * len(admit)  # the prefill
        cost += sim.per_forward_s + sim.per_row_s * len(self.loop)
        self.forwards += 1
        if cost > 0:
            await asyncio.sleep(cost)
        return self.loop.step(version)

    async def swap(self, version: int, state_dict: Mapping[str, Any]) -> None:
        self._version = version
