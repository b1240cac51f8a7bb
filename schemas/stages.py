"""The pipeline declared once: which stage reads and writes which topic, in which consumer group,
from which config section, and what it commits before it moves on.

The topic table (:mod:`rollstream.schemas.topics`) says what each topic carries; this table says
who is on each end. The command line's stage list (``rollstream sampler``, ...), ``rollstream
run``'s processes and the order it starts them in, the watcher's hops (what waits between two
stages) and the README's topic table (``topics_table``; a test compares them) are read from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StageSpec:
    name: str  # the command and the process name
    module: str  # has ``async def run(config, **options)``
    summary: str  # one line: what the stage does (the command's help)
    section: str  # its config section
    consumes: tuple[str, ...] = ()  # topics it reads in its consumer group
    produces: tuple[str, ...] = ()  # topics it writes (besides the .dlq of what it consumes)
    group: str | None = None  # its consumer group, under infra.topic_prefix (None: it consumes nothing)
    commits: str = ""  # what it has done before it commits an input offset
    own_consumer: bool = False  # it reads its topics with a consumer of its own (Faust's; one over every topic)
    redis: bool = True  # it keeps state or progress in Redis


STAGES: tuple[StageSpec, ...] = (
    StageSpec("sampler", "rollstream.producers.sampler", "publish PromptIssued events from task sources",
              "sampler", produces=("prompts",),
              commits="(a producer) its position in the task order, in Redis, after the broker acknowledged the groups"),
    StageSpec("generator", "rollstream.consumers.generator.stage",
              "turn prompts into G completions each (transformers or SGLang)", "generator",
              consumes=("prompts",), produces=("actions",), group="generators",
              commits="a prompt once every completion it asked for was acknowledged"),
    StageSpec("executor", "rollstream.consumers.executor.stage", "run completions in Docker sandboxes and score them",
              "executor", consumes=("actions",), produces=("rewards", "audit", "prompts"), group="executors",
              commits="an action once its reward (or next turn) and audit were acknowledged"),
    StageSpec("stream", "rollstream.streams.advantages",
              "gather each group's rewards and compute advantages (Faust)", "stream",
              consumes=("rewards",), produces=("advantages",), group="stream",
              commits="a reward once it is in its open group in Redis (a group is emitted exactly once)",
              own_consumer=True),
    StageSpec("learner", "rollstream.learner.train", "train the policy on advantages and broadcast weights", "learner",
              consumes=("advantages",), produces=("policy", "fates"), group="learner",
              commits="the groups of a step in the checkpoint that follows it (offsets restored on resume)"),
    StageSpec("archiver", "rollstream.consumers.archiver.stage",
              "sink every topic of a run into the run archive (Parquet)", "archive",
              consumes=("prompts", "actions", "rewards", "advantages", "policy", "fates", "audit", "evals"),
              group="archiver", commits="records once the Parquet file holding them is durable",
              own_consumer=True, redis=False),
    StageSpec("evaluator", "rollstream.evaluator.stage",
              "held-out pass@k of the policy versions a run publishes (evals)", "eval",
              consumes=("policy",), produces=("evals",), group="evaluator",
              commits="a version once its report was acknowledged and recorded done in Redis"),
)
SPECS: dict[str, StageSpec] = {s.name: s for s in STAGES}
# The order `rollstream run` starts them in: every consumer before what feeds it, the sampler
# (which starts the flow) last but the evaluator.
RUN_ORDER: tuple[str, ...] = ("archiver", "learner", "stream", "executor", "generator", "sampler", "evaluator")
# Stages that only watch the flow: they are not hops of it.
OBSERVERS: frozenset[str] = frozenset({"archiver", "evaluator"})
# The stages the flow passes through, in RUN_ORDER (what a chaos drill starts, kills and restarts).
FLOW: tuple[str, ...] = tuple(name for name in RUN_ORDER if name not in OBSERVERS)


def hops() -> dict[str, tuple[str, str]]:
    """topic -> (the stage that writes it, the stage that reads it) along the flow, observers left
    out: what waits between two stages. A stage's first ``produces`` is its output along the flow
    (the executor's next turns on ``prompts`` re-enter it; they are not a hop of their own)."""
    primary = {s.produces[0]: s.name for s in STAGES if s.produces and s.name not in OBSERVERS}
    return {topic: (primary[topic], s.name) for s in STAGES if s.name not in OBSERVERS
            for topic in s.consumes if topic in primary}


def consumer_group(prefix: str, stage: str) -> str:
    """The consumer group of ``stage`` under the run's topic prefix."""
    group = SPECS[stage].group
    if group is None:
        raise ValueError(f"{stage} consumes nothing")
    return f"{prefix}{group}"


def topics_table() -> str:
    """The README's topic table: every topic, its event, who writes it and who reads it in which
    consumer group (the archiver reads them all), from the topic and stage tables."""
    from rollstream.schemas.topics import TOPICS

    rows = ["| topic | event | written by | read by (consumer group) |", "|---|---|---|---|"]
    for name, spec in TOPICS.items():
        writers = [s.name for s in STAGES if name in s.produces]
        readers = [f"{s.name} (`{s.group}`)" for s in STAGES if name in s.consumes and s.name != "archiver"]
        rows.append(f"| `{name}` | `{spec.event.__name__}` | {', '.join(writers)} | "
                    f"{', '.join(readers) or 'tools (inspect, runs, replay)'}, archiver |")
    rows.append("| `<topic>.dlq` | `DeadLetter` | the stage that could not handle a record | operators, replay |")
    return "\n".join(rows)
