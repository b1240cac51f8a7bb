"""What every stage opens before its loop, from its :class:`~rollstream.schemas.stages.StageSpec`:
its metrics (served on its section's ``metrics_port``), its topics (what it consumes and produces,
created if missing), Redis (unless the spec says it keeps nothing there), its producer (when it
produces or consumes: dead letters), its consumer (the spec's first topic, in the spec's consumer
group; none for a stage with a consumer of its own: the stream's is Faust's, the archiver's reads
every topic) and its poison-record guard.

    >>> async def run(config):  # doctest: +SKIP
    ...     async with open_stage(config, "executor", client_id="executor-1", guard=True) as io:
    ...         ...  # io.consumer, io.producer, io.redis, io.guard, io.metrics

Closed in reverse order on the way out (the consumer, then the producer, then Redis), so a stage
that stops commits what it finished through a producer that is still open.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from rollstream.config import Config
from rollstream.guard import IntakeGuard
from rollstream.kafka import EventConsumer, EventProducer, ensure_topics
from rollstream.metrics import StageMetrics, serve_metrics
from rollstream.schemas.stages import SPECS, StageSpec, consumer_group


@dataclass(frozen=True)
class StageIO:
    spec: StageSpec
    metrics: StageMetrics
    redis: Any  # redis.asyncio.Redis (None: the spec's stage keeps nothing in Redis)
    producer: EventProducer | None  # None: the stage produces nothing (the archiver)
    consumer: EventConsumer[Any] | None  # None: it consumes nothing (the sampler) or with its own consumer
    guard: IntakeGuard | None  # with guard=True


@contextlib.asynccontextmanager
async def open_stage(config: Config, stage: str, *, client_id: str, metrics: StageMetrics | None = None,
                     redis: Any = None, guard: bool = False, extra_topics: Sequence[str] = (),
                     **consumer_options: Any) -> AsyncIterator[StageIO]:
    """Open ``stage``'s plumbing (see the module docstring). ``redis``: a client of the caller's,
    left open; ``extra_topics``: created too (a topic the stage reads in a group of its own);
    ``consumer_options``: passed to :class:`EventConsumer` (``start_offsets``, ``max_poll_records``)."""
    from rollstream.infra import resolve_endpoints
    from rollstream.redis import connect

    spec = SPECS[stage]
    metrics = metrics or StageMetrics(stage)
    serve_metrics(getattr(config, spec.section).metrics_port, metrics)
    await ensure_topics(config.infra, list(dict.fromkeys([*spec.consumes, *spec.produces, *extra_topics])))
    async with contextlib.AsyncExitStack() as stack:
        if redis is None and spec.redis:
            redis = connect(resolve_endpoints(config).redis_url)
            stack.push_async_callback(redis.aclose)
        producer = None
        if spec.produces or (spec.consumes and not spec.own_consumer):
            producer = await stack.enter_async_context(
                EventProducer(config.infra, client_id=client_id, metrics=metrics, stage=stage))
        consumer = None
        if spec.consumes and not spec.own_consumer:
            consumer = await stack.enter_async_context(EventConsumer(
                config.infra, spec.consumes[0], group_id=consumer_group(config.infra.topic_prefix, stage),
                producer=producer, stage=stage, metrics=metrics, client_id=client_id, **consumer_options))
        yield StageIO(spec, metrics, redis, producer, consumer,
                      IntakeGuard(redis, config.infra, stage, metrics) if guard else None)
