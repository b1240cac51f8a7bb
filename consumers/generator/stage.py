"""The generator stage: ``prompts`` -> ``actions``.

Consumes ``PromptIssued`` (consumer group ``<topic prefix>generators``). For each, samples ``group_size``
completions of its chat-templated messages and produces one ``ActionGenerated`` per sample,
keyed by group id, with the prompt and completion token ids, the behaviour log-prob of every
completion token, the policy version of the weights used, the finish reason and timings.

Guarantees:

* At-least-once: a prompt's offset is committed only after all of its G actions were
  acknowledged (acks=all). A generator killed mid-group regenerates the whole group after a
  restart; downstream dedupes by ``rollout_id`` = ``{group_id}/{sample_index}``. Seeds are
  derived from (seed, group_id, sample_index), so a regenerated sample is the same sample
  unless the weights changed in between (then its recorded version says so).
* Prompts of several events are batched into one generate call (at most
  ``max_batch_prompts`` events, waiting at most ``batch_wait_ms`` for more after the first).
  With the transformers backend (continuous: backends/decode.py) calls overlap: a batch joins
  the running decode loop as soon as its rows fit ``max_rows``, and every sample's action is
  sent the moment its row finishes, so a continuation or a short sample never waits for the
  longest row of another batch. Other backends generate one batch at a time, sending a batch's
  actions overlapping the next one.
* Multi-turn episodes (consumers/executor/episodes.py): a ``PromptIssued`` with a continuation asks for the
  next turn of one sample. Its observation is rendered as a user turn of the chat template and
  appended to the transcript; the action's rollout spans every turn, with the mask of the
  model's tokens.
* Bad input never stops the stage: undecodable events are dead-lettered by the consumer;
  events that decode but cannot be served (an inconsistent continuation, messages the chat
  template rejects) are dead-lettered here. A prompt longer
  than the model's context yields G ``ActionGenerated`` with ``error`` set and finish reason
  "error" (so the group still completes downstream).
* Weights are swapped between two forwards, rows in progress continuing under the new ones
  (``generator.update = "in_flight"``: a rollout records the first and last version it spans),
  or once the rows in the decode loop have finished (``"between_batches"``); see
  ``consumers/generator/weight_sync.py`` and docs/generator.md.
* Poison records and duplicates (rollstream/guard.py): a prompt taken ``infra.poison_attempts``
  times without finishing is dead-lettered; a group already generated and acknowledged is skipped
  (records with the ``rollstream-replay`` header are always generated).
* SIGTERM: stop taking input, finish the batches in flight, send, commit, exit 0; within
  ``infra.stop_grace_s`` (default 10 s): batches still generating 3 s before it are abandoned
  uncommitted (their rows leave the decode loop; rollstream/lifecycle.py), and queued prompts
  are never started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from rollstream.config import Config, GeneratorConfig
from rollstream.consumers.generator.backends.base import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    Sampling,
    completions_as_done,
)
from rollstream.consumers.generator.backends.sampling import derive_seed
from rollstream.consumers.generator.chat import chat_prompt_ids
from rollstream.consumers.generator.turns import (
    continued,
    continued_rollout,
    invalid_continuation,
    observation_ids,
)
from rollstream.consumers.generator.weight_sync import WeightSync
from rollstream.cpus import pin
from rollstream.errors import BackendError
from rollstream.guard import IntakeGuard
from rollstream.kafka import Delivery, EventConsumer, EventProducer
from rollstream.metrics import StageMetrics
from rollstream.registry import Registry
from rollstream.schemas.events import ActionGenerated, PromptIssued, Rollout, SamplingParams
from rollstream.tasks import domain_of

log = logging.getLogger(__name__)
PREFIX_LOG_S = 60.0  # the prefix cache's counts are logged at most this often
STAGE = "generator"
MIN_LOGPROB = -1e4  # the schema's floor
PROMPT_CACHE_ENTRIES = 4096  # templated prompts kept (least recently used dropped first)
TOP_K_LIMIT = 1 << 30  # larger than any vocabulary: top_k at or above a model's vocabulary is off


@dataclass(frozen=True, slots=True)
class Prepared:
    """A prompt event that passed validation, with its prompt token ids."""

    delivery: Delivery[PromptIssued]
    prompt_ids: list[int]  # a continuation's: prompt, transcript so far, observation
    suspect: bool = False  # taken before and never finished: generated in a batch of its own
    observation_tokens: list[int] | None = None  # a continuation's observation


def resolve_sampling(defaults: GeneratorConfig, override: SamplingParams) -> Sampling:
    """The prompt's sampling overrides on top of the configured defaults, within the stage's ceilings
    (``generator.max_new_tokens_limit``; a top_k beyond any vocabulary is off)."""

    def pick(value: Any, default: Any) -> Any:
        return default if value is None else value

    return Sampling(
        temperature=pick(override.temperature, defaults.temperature),
        top_p=pick(override.top_p, defaults.top_p),
        # Any top_k at or above the vocabulary means "off"; bounded so that it fits a tensor.
        top_k=min(pick(override.top_k, defaults.top_k), TOP_K_LIMIT),
        max_new_tokens=min(pick(override.max_new_tokens, defaults.max_new_tokens), defaults.max_new_tokens_limit),
        stop=tuple(pick(override.stop, defaults.stop)),
    )


def group_requests(event: PromptIssued, prompt_ids: list[int], defaults: GeneratorConfig,
                   base_seed: int) -> list[GenerationRequest]:
    """The G requests of one prompt event (one for a continuation: its sample's next turn); seeds
    are stable per (seed, group_id, sample_index, turn)."""
    sampling = resolve_sampling(defaults, event.sampling)
    seed = base_seed if event.sampling.seed is None else event.sampling.seed
    c = event.continuation
    if c is not None:
        return [GenerationRequest(request_id=f"{event.group_id}/{c.sample_index}", prompt_token_ids=prompt_ids,
                                  sampling=sampling, seed=derive_seed(seed, f"{event.group_id}#{c.turn}",
                                                                       c.sample_index),
                                  task_id=event.task_id, turn=c.turn, subtask=c.subtask_index,
                                  more_turns=c.turn < event.max_turns)]
    return [
        GenerationRequest(
            request_id=f"{event.group_id}/{index}",
            prompt_token_ids=prompt_ids,
            sampling=sampling,
            seed=derive_seed(seed, event.group_id, index),
            task_id=event.task_id,
            more_turns=event.max_turns > 1,
        )
        for index in range(event.group_size)
    ]


def unit_of(event: PromptIssued) -> str:
    """What the generator does once per prompt event: a group, or one turn of one sample."""
    c = event.continuation
    return event.group_id if c is None else f"{event.group_id}/{c.sample_index}#{c.turn}"


def clamped(logprobs: list[float]) -> list[float]:
    """Log-probs within the schema's range [MIN_LOGPROB, 0] (checked with C loops first: almost
    every completion is within it already)."""
    if logprobs and (min(logprobs) < MIN_LOGPROB or max(logprobs) > 0.0):
        return [max(MIN_LOGPROB, min(0.0, lp)) for lp in logprobs]
    return logprobs


def action_from(event: PromptIssued, index: int, prompt_ids: list[int], completion: Completion, *,
                generator_id: str, queued_s: float, generate_s: float,
                observation_tokens: list[int] | None = None) -> ActionGenerated:
    """One ``ActionGenerated`` for sample ``index`` of ``event`` (for a continuation: the episode so
    far, with ``observation_tokens`` between the last turn and this one)."""
    c = event.continuation
    if c is not None:
        rollout = continued_rollout(
            event, observation_tokens or [], completion.token_ids, clamped(completion.logprobs),
            version_first=completion.policy_version_first, version_last=completion.policy_version_last,
            finish_reason=completion.finish_reason, logprob_temperature=completion.logprob_temperature)
    else:
        rollout = Rollout(
            rollout_id=f"{event.group_id}/{index}",
            group_id=event.group_id,
            sample_index=index,
            group_size=event.group_size,
            task_id=event.task_id,
            family=event.family,
            domain=domain_of(event.reward.kind),
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion.token_ids,
            behaviour_logprobs=clamped(completion.logprobs),
            logprob_temperature=completion.logprob_temperature,
            policy_version_first=completion.policy_version_first,
            policy_version_last=completion.policy_version_last,
            issued_policy_version=event.issued_policy_version,
            finish_reason=completion.finish_reason,
        )
    return ActionGenerated(
        rollout=rollout,
        completion_text=completion.text,
        reward=event.reward,
        max_turns=event.max_turns,
        turn=c.turn if c is not None else 1,
        subtask_index=c.subtask_index if c is not None else 0,
        carried_code=c.carried_code if c is not None else "",
        workspace=list(c.workspace) if c is not None else [],
        policy_versions=sorted({*(c.policy_versions if c is not None else ()),
                                completion.policy_version_first, completion.policy_version_last})[-1024:],
        error=completion.error,
        generator_id=generator_id,
        queued_s=max(0.0, queued_s),
        generate_s=max(0.0, generate_s),
        generated_at=time.time(),
    )


def _scripted(config: Config) -> GenerationBackend:
    from rollstream.consumers.generator.backends.scripted import ScriptedBackend

    return ScriptedBackend.load(config)


def _sim(config: Config) -> GenerationBackend:
    from rollstream.consumers.generator.backends.scripted import SimBackend, SimDecodeBackend

    server = config.generator.backend
    if server.per_forward_s or server.per_row_s:
        return SimDecodeBackend.load(config)
    return SimBackend.load(config)


def _transformers(config: Config) -> GenerationBackend:
    import torch

    from rollstream.consumers.generator.backends.hf import TransformersBackend

    gen = config.generator
    pin(gen.cpus, "generator")
    if gen.torch_threads:
        torch.set_num_threads(gen.torch_threads)  # oversubscribed OpenMP threads spin and crawl
    return TransformersBackend.load(gen.model, device=gen.device, dtype=gen.dtype, max_rows=gen.max_rows,
                                    max_kv_tokens=gen.max_kv_tokens, max_lanes=gen.max_lanes,
                                    lane_split_tokens=gen.lane_split_tokens,
                                    prefix_cache_tokens=gen.prefix_cache_tokens, update=gen.update)


def _sglang(config: Config) -> GenerationBackend:
    from rollstream.consumers.generator.backends.sglang import SGLangBackend
    from rollstream.consumers.generator.chat import max_context
    from rollstream.models import load_model_config, load_tokenizer, resolve_model

    gen = config.generator
    files = resolve_model(gen.model, cache_dir=None)  # model_dir: a plain directory spec only
    return SGLangBackend(gen.backend, load_tokenizer(gen.model), context=max_context(load_model_config(gen.model)),
                         model_dir=None if files.gguf_file else str(files.directory), update=gen.update)


# Generation backends by their config tag (``generator.backend.kind``): a builder from the config
# (loads the model: slow; call it in a thread). More register through the entry-point group.
BACKENDS: Registry[Callable[[Config], GenerationBackend]] = Registry(
    "generator backend", "rollstream.generator_backends", "BACKENDS.register",
    {"transformers": _transformers, "sglang": _sglang, "scripted": _scripted, "sim": _sim})


def build_backend(config: Config) -> GenerationBackend:
    """The configured backend (loads the model: slow; call it in a thread)."""
    return BACKENDS.get(config.generator.backend.kind)(config)


class GeneratorStage:
    """The intake, batching and publishing loops around one backend."""

    def __init__(self, config: Config, backend: GenerationBackend, consumer: EventConsumer[PromptIssued],
                 producer: EventProducer, sync: WeightSync, metrics: StageMetrics, generator_id: str,
                 guard: IntakeGuard | None = None) -> None:
        self.config = config
        self.guard = guard
        self.gen = config.generator
        self.backend = backend
        self.consumer = consumer
        self.producer = producer
        self.sync = sync
        self.metrics = metrics
        self.generator_id = generator_id
        self.queue: asyncio.Queue[Prepared] = asyncio.Queue(maxsize=2 * self.gen.max_batch_prompts)
        self._held: Prepared | None = None
        self._templated = functools.lru_cache(maxsize=PROMPT_CACHE_ENTRIES)(self._template)
        self.tokens_out = metrics.counter("generator_completion_tokens", "Completion tokens generated")
        self.version_gauge = metrics.gauge("generator_policy_version", "Policy version of the loaded weights")
        self.errors = metrics.counter("generator_failed_samples", "Samples recorded as failures", ("reason",))
        self.batch_seconds = metrics.histogram("generator_batch_seconds", "Wall time of one generate call")
        self._busy = _Busy(metrics.gauge("generator_generating", "1 while a generate call runs, else 0"),
                           metrics.histogram("generator_busy_seconds", "Busy periods: from a generate call "
                                             "starting while none ran to the last one ending (their sum counts "
                                             "overlapping calls once)"))
        self._commit_lock = asyncio.Lock()  # batches finish concurrently: one commit at a time
        self._prefix_lookups = metrics.counter(
            "generator_prefix_cache_lookups", "Later turns of an episode that found the cache of its previous "
            "turn kept (hit: only the observation is prefilled) or not (miss)", ("result",))
        self._prefix_seen = (0, 0)
        self._prefix_logged = 0.0

    def prefix_lookups(self) -> tuple[int, int]:
        """(hits, misses) of the backend's prefix cache so far, exported to the metric; (0, 0) for a
        backend without one."""
        seen = self.backend.prefix_lookups
        for result, now, before in zip(("hit", "miss"), seen, self._prefix_seen, strict=True):
            if now > before:
                self._prefix_lookups.labels(result).inc(now - before)
        if seen != self._prefix_seen and time.monotonic() - self._prefix_logged > PREFIX_LOG_S:
            self._prefix_logged = time.monotonic()
            log.info("later turns so far: %d found their previous turn's cache kept, %d did not", *seen)
        self._prefix_seen = seen
        return seen

    async def intake(self, stop: asyncio.Event) -> None:
        """Poll ``prompts``, validate, tokenize, queue (bounded: backpressure on the poll)."""
        while not stop.is_set():
            deliveries = await self.consumer.getmany(max_records=self.gen.max_batch_prompts, timeout_s=0.5)
            admitted = [(d, False) for d in deliveries]
            if self.guard is not None and deliveries:  # skip groups already generated; dead-letter poison
                keep = await self.guard.screen(deliveries, [unit_of(d.event) for d in deliveries], self.consumer,
                                               self.producer)
                admitted = [(deliveries[i], suspect) for i, suspect in keep]
            for delivery, suspect in admitted:
                prepared = await self._prepare(delivery, suspect)
                if prepared is not None:
                    await self.queue.put(prepared)

    async def _prepare(self, delivery: Delivery[PromptIssued], suspect: bool = False) -> Prepared | None:
        event = delivery.event
        reason = None
        observed: list[int] | None = None
        if event.continuation is not None:
            reason = invalid_continuation(event, self.backend.tokenizer)
            if reason is None:
                c = event.continuation
                try:
                    observed = observation_ids(self.backend.tokenizer, c.observation, c.completion_token_ids)
                except (TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
                    reason = f"invalid: chat template rejected the observation: {type(exc).__name__}: {exc}"
                else:
                    prompt_ids = continued(event, observed)
        else:
            try:
                prompt_ids = self.prompt_ids(event)
            except (TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:  # bad input, not a bug
                reason = f"invalid: chat template rejected the messages: {type(exc).__name__}: {exc}"
        if reason is not None:
            await self.producer.dead_letter(delivery, reason, stage=STAGE)
            if self.guard is not None:
                self.guard.released(delivery)
            self.consumer.done(delivery)
            return None
        return Prepared(delivery, prompt_ids, suspect, observed)

    def prompt_ids(self, event: PromptIssued) -> list[int]:
        """The chat-templated prompt's token ids; a task's prompt recurs every epoch, so they are
        cached by its messages (the template is slow to render)."""
        return list(self._templated(tuple((m.role, m.content) for m in event.messages)))

    def _template(self, messages: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
        return tuple(chat_prompt_ids(self.backend.tokenizer, [{"role": r, "content": c} for r, c in messages]))

    async def next_batch(self, stop: asyncio.Event) -> list[Prepared]:
        """Up to ``max_batch_prompts`` events: wait for one, then at most ``batch_wait_ms`` for more.
        A suspect (rollstream/guard.py) is a batch of its own."""
        if self._held is not None:
            first, self._held = self._held, None
        else:
            try:
                first = await asyncio.wait_for(self.queue.get(), timeout=0.5)
            except TimeoutError:
                return []
        batch = [first]
        deadline = time.monotonic() + self.gen.batch_wait_ms / 1000
        while not first.suspect and len(batch) < self.gen.max_batch_prompts and not stop.is_set():
            try:
                item = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self.queue.get(), timeout=remaining)
                except TimeoutError:
                    break
            if item.suspect:
                self._held = item  # the next batch, alone
                break
            batch.append(item)
        return batch

    async def serve(self, stop: asyncio.Event) -> None:
        """Take batch after batch and generate them: with a continuous backend, batches overlap as
        long as their rows fit ``generator.max_rows`` (each joins the running decode loop, and each
        row is published as it finishes); otherwise one batch generates at a time, the sending of
        its actions overlapping the next one."""
        continuous = self.gen.continuous and self.backend.continuous
        capacity = _Capacity(self.gen.max_rows if continuous else 1)
        most_batches = self.gen.max_rows if continuous else 2  # generating or still being sent: bounded memory
        running: set[asyncio.Task[None]] = set()
        failed: list[BaseException] = []

        def finished(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if not task.cancelled() and task.exception() is not None:
                failed.append(task.exception())  # type: ignore[arg-type]

        try:
            while not stop.is_set() and not failed:
                batch = await self.next_batch(stop)
                if not batch:
                    continue
                # A suspect (rollstream/guard.py) runs alone: nothing else is in flight if it kills the process.
                need = (capacity.limit if batch[0].suspect else sum(_rows_of(item.delivery.event) for item in batch)
                        ) if continuous else 1
                while len(running) >= most_batches:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                await capacity.acquire(need)
                try:
                    issued_at = max(item.delivery.event.issued_policy_version for item in batch)
                    await self.sync.catch_up(issued_at, self.gen.weight_wait_s)
                    await self.sync.apply_pending(wait_s=self.gen.weight_wait_s)
                    await self.sync.wait_until_fresh(stop)
                    self.version_gauge.set(self.backend.policy_version)
                    if batch[0].suspect and self.guard is not None:
                        await self.guard.start_suspect(batch[0].delivery)
                except BaseException:
                    capacity.release(need)
                    raise
                task = asyncio.create_task(self.run_batch(batch, functools.partial(capacity.release, need)))
                running.add(task)
                task.add_done_callback(finished)
            if failed:
                raise failed[0]
        except BaseException:
            for task in running:
                task.cancel()  # a failure, or the stop bound reached: what is in flight stays uncommitted
            raise
        finally:
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def run_batch(self, batch: Sequence[Prepared], release: Callable[[], None] | None = None) -> None:
        """Generate a batch, sending each action as its sample finishes; ``release`` once every sample
        is generated (sends may still be in flight); mark the prompts done and commit once every
        action was acknowledged."""
        sends: list[asyncio.Task[None]] = []
        try:
            async for action in self.generate_each(batch):
                sends.append(asyncio.create_task(self.producer.send_many([("actions", action)])))
        except BaseException:
            for send in sends:
                send.cancel()
            raise
        finally:
            if release is not None:
                release()
        await asyncio.gather(*sends)
        await self._finish(batch, len(sends))

    def _requests(self, batch: Sequence[Prepared]) -> list[GenerationRequest]:
        requests: list[GenerationRequest] = []
        for item in batch:
            requests += group_requests(item.delivery.event, item.prompt_ids, self.gen, self.config.rl.seed)
        return requests

    async def generate_each(self, batch: Sequence[Prepared]) -> AsyncIterator[ActionGenerated]:
        """The batch's actions as their samples finish (from a backend without ``submit``: all at once)."""
        requests = self._requests(batch)
        owners: list[tuple[Prepared, int]] = []
        for item in batch:
            c = item.delivery.event.continuation
            owners += [(item, index) for index in
                       ([c.sample_index] if c is not None else range(item.delivery.event.group_size))]
        started = time.time()
        self._busy.start()
        try:
            async with contextlib.aclosing(self._complete(requests)) as completions:
                async for position, completion in completions:
                    item, index = owners[position]
                    event = item.delivery.event
                    self.tokens_out.inc(len(completion.token_ids))
                    if completion.error:
                        self.errors.labels("prompt_too_long" if "too long" in completion.error else "other").inc()
                        log.warning("group %s sample %d failed: %s", event.group_id, index, completion.error)
                    yield action_from(event, index, item.prompt_ids, completion, generator_id=self.generator_id,
                                      queued_s=started - item.delivery.received_at,
                                      generate_s=time.time() - started, observation_tokens=item.observation_tokens)
        finally:
            self._busy.stop()
            self.prefix_lookups()
        self.batch_seconds.observe(time.time() - started)

    async def _complete(self, requests: list[GenerationRequest], attempts: int = 3
                        ) -> AsyncIterator[tuple[int, Completion]]:
        """``(request index, completion)`` as each finishes; after a BackendError the requests not yet
        done are asked for again (3 attempts, 1 s then 2 s apart). After the last attempt the error
        stops the stage: uncommitted prompts are redelivered to a healthy generator."""
        done: set[int] = set()
        for attempt in range(1, attempts + 1):
            todo = [i for i in range(len(requests)) if i not in done]
            try:
                async with contextlib.aclosing(completions_as_done(self.backend, [requests[i] for i in todo])) as out:
                    async for j, completion in out:
                        done.add(todo[j])
                        yield todo[j], completion
                return
            except BackendError as exc:
                if attempt == attempts:
                    raise
                log.warning("generate failed (attempt %d of %d, %d of %d samples to redo): %s", attempt, attempts,
                            len(requests) - len(done), len(requests), exc)
                await asyncio.sleep(float(2 ** (attempt - 1)))

    async def _finish(self, batch: Sequence[Prepared], actions: int) -> None:
        """Every action of ``batch`` was acknowledged: mark its prompts done and commit."""
        for item in batch:
            if self.guard is not None:
                self.guard.finished(item.delivery, unit_of(item.delivery.event))
            self.consumer.done(item.delivery)
        async with self._commit_lock:
            if self.guard is not None:
                await self.guard.flush()
            await self.consumer.commit()
        first = batch[0].delivery
        log.debug("sent %d actions for %d groups (first %s [%d]@%d), weights v%d", actions, len(batch),
                  first.event.group_id, first.partition, first.offset, self.backend.policy_version)


def _rows_of(event: PromptIssued) -> int:
    return 1 if event.continuation is not None else event.group_size


class _Capacity:
    """Rows (or batches) in flight, at most ``limit``; one batch over the limit alone is let through."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._changed = asyncio.Event()

    async def acquire(self, n: int) -> None:
        while not (self.used == 0 or self.used + n <= self.limit):
            self._changed.clear()
            await self._changed.wait()
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        self._changed.set()


class _Busy:
    """Periods during which at least one generate call runs (overlapping calls counted once), and
    the gauge that is 1 meanwhile."""

    def __init__(self, gauge: Any, seconds: Any) -> None:
        self.gauge, self.seconds = gauge, seconds
        self.calls = 0
        self.since = 0.0

    def start(self) -> None:
        if self.calls == 0:
            self.since = time.monotonic()
            self.gauge.set(1)
        self.calls += 1

    def stop(self) -> None:
        self.calls -= 1
        if self.calls == 0:
            self.seconds.observe(time.monotonic() - self.since)
            self.gauge.set(0)


async def run(config: Config, *, backend: GenerationBackend | None = None, redis: Any = None,
              stop: asyncio.Event | None = None, metrics: StageMetrics | None = None) -> None:
    """Run the generator until ``stop`` is set (default: SIGTERM/SIGINT)."""
    from rollstream.lifecycle import stop_event
    from rollstream.stage_io import open_stage
    from rollstream.weight_files import open_weight_store
    from rollstream.weights import learner_version

    infra, gen = config.infra, config.generator
    stop = stop or stop_event(config.infra.stop_grace_s)
    generator_id = f"{STAGE}-{socket.gethostname()}-{os.getpid()}"
    log.info("generator %s: backend %s, model %s, batch <= %d prompts / %d ms", generator_id, gen.backend.kind,
             gen.model, gen.max_batch_prompts, gen.batch_wait_ms)
    async with AsyncExitStack() as stack:
        if backend is None:
            backend = await asyncio.to_thread(build_backend, config)
            stack.push_async_callback(backend.aclose)
            await backend.wait_ready()
        io = await stack.enter_async_context(open_stage(config, STAGE, client_id=generator_id, metrics=metrics,
                                                        redis=redis, guard=True))
        metrics, redis = io.metrics, io.redis
        store = open_weight_store(redis, key_prefix=infra.key_prefix, settings=config.weights)
        sync_seconds = metrics.histogram("generator_weight_sync_seconds", "Weight sync of one version: fetch "
                                         "(fetch, verify, prepare) and swap", labels=("phase",))
        sync = WeightSync(store, backend, poll_s=gen.weight_poll_s,
                          max_staleness=config.rl.max_staleness if gen.max_staleness_refuse else None,
                          learner_version=lambda: learner_version(redis, infra.key_prefix),
                          observe=lambda phase, seconds: sync_seconds.labels(phase).observe(seconds),
                          swap_when_ready=gen.continuous and backend.update == "in_flight")
        await sync.load_initial()
        assert io.consumer is not None and io.guard is not None
        stage = GeneratorStage(config, backend, io.consumer, io.producer, sync, metrics, generator_id, io.guard)
        async with asyncio.TaskGroup() as tasks:
            follower = tasks.create_task(sync.run())
            intake = tasks.create_task(stage.intake(stop))
            await stage.serve(stop)
            intake.cancel()
            follower.cancel()
    log.info("generator %s stopped", generator_id)
