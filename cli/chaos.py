"""Chaos drills: run every stage as its own process (started as ``rollstream STAGE``), SIGKILL them
at random and restart them, then account for every group from the topics alone.

:class:`Drill` starts the stages of a config (``processes`` per stage), kills and restarts them
(the learner with ``--resume``), and stops them; :func:`account` reads ``prompts`` and ``fates``
(and the stream's set of dropped groups) and says which issued groups were lost and which the
surviving model lineage trained twice. ``bench/chaos.py`` and the e2e tests use it, with the
config :func:`drill_config` writes (simulated backends, short timeouts).

The surviving lineage: each learner run resumes from the checkpoint of the run before it, at the
step its first fate names (one before, for a trained fate). The fates a run published after that
step were undone by the crash (that run's weights after its last checkpoint are gone), and the
groups behind them are consumed again by the next run: they count once.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from rollstream.config import Config
from rollstream.schemas.stages import FLOW

STAGES = FLOW  # the stages a drill starts, kills and restarts (schemas/stages.py), in start order


def drill_config(work: Path, name: str, bootstrap: str, redis_url: str, model: Path, *, max_turns: int = 1,
                 learner_ranks: int = 1) -> Path:
    """Write ``work/<name>.toml``: a drill's pipeline on simulated backends (docs/capacity.md), its
    topics and keys under ``name``; returns its path. ``learner_ranks`` > 1: the learner trains the
    tiny model for real on that many ranks (ddp, under torchrun; the simulated learner trains
    nothing, so it has one rank; the tiny model's steps take about as long as the simulated ones)."""
    from rollstream import config as c
    from rollstream.config_load import to_toml

    learner = c.LearnerConfig(model=str(model), broadcast_dtype="float32",
                              checkpoint=c.CheckpointConfig(dir=str(work / name / "checkpoints"), every=2),
                              backend=c.SimLearnerConfig(per_token_s=0.002))
    if learner_ranks > 1:
        learner = msgspec.structs.replace(learner, backend=c.TorchConfig(), parallel="ddp", ranks=learner_ranks,
                                          micro_batch=4, torch_threads=1)
    config = c.Config(
        # a SIGKILLed member's partitions move after 6 s (docs/resilience.md)
        infra=c.InfraConfig(kafka_bootstrap=bootstrap, redis_url=redis_url, topic_prefix=f"{name}.",
                            key_prefix=f"{name}:", state_dir=str(work / name), partitions=4, session_timeout_s=6),
        rl=c.RLConfig(group_size=4, groups_per_step=1, max_staleness=2),
        sampler=c.SamplerConfig(poll_s=0.1, max_turns=max_turns, turn_penalty=0.1),
        generator=c.GeneratorConfig(model=str(model), max_new_tokens=256, max_batch_prompts=2, batch_wait_ms=10,
                                    backend=c.SimGeneratorConfig(base_s=0.05, per_token_s=0.002, mean_tokens=48,
                                                                 sigma=0.6)),
        executor=c.ExecutorConfig(backend=c.SimExecutorConfig(seconds=0.01), concurrency=8, pool_size=8),
        stream=c.StreamConfig(sweep_interval_s=0.5),
        learner=learner,
    )
    path = work / f"{name}.toml"
    path.write_text(to_toml(config))
    return path


@dataclass
class Process:
    stage: str
    index: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def name(self) -> str:
        return f"{self.stage}-{self.index}"


@dataclass
class Drill:
    """The stage processes of one config, started, killed, restarted and stopped by pid."""

    config_path: Path
    logs: Path
    processes: dict[str, int] = field(default_factory=lambda: {"sampler": 1, "generator": 2, "executor": 2,
                                                              "stream": 2, "learner": 1})
    running: list[Process] = field(default_factory=list)
    kills: int = 0
    restarts: int = 0
    killed: Counter[str] = field(default_factory=Counter)

    def start_all(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        for stage in STAGES:  # every consumer before what feeds it
            for index in range(self.processes.get(stage, 0)):
                self.running.append(self.spawn(stage, index))

    def spawn(self, stage: str, index: int) -> Process:
        """Started as ``rollstream run`` starts its stages (the learner always resuming)."""
        from rollstream.cli.run import spawn_stage

        args = ["--config", str(self.config_path), *(["--resume"] if stage == "learner" else [])]
        child = spawn_stage(stage, index, args, self.logs, 0, dict(os.environ, PYTHONUNBUFFERED="1"),
                            name=f"{stage}-{index}")
        return Process(stage, index, child.proc, child.log)

    def kill(self, victim: Process) -> None:
        """SIGKILL ``victim`` and start it again."""
        if victim.proc.poll() is None:
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait()
        self.kills += 1
        self.killed[victim.stage] += 1
        self.running.remove(victim)
        self.running.append(self.spawn(victim.stage, victim.index))
        self.restarts += 1

    def kill_rank(self, rng: random.Random) -> int:
        """SIGKILL one rank of a learner started with several (``learner.ranks``): torchrun ends the
        others and starts them all again, resuming from the last checkpoint; the learner process
        (the launcher) stays. Returns the rank killed."""
        learner = next(p for p in self.running if p.stage == "learner")
        ranks = rank_pids(learner.proc.pid)
        if not ranks:
            raise RuntimeError(f"learner pid {learner.proc.pid} has no ranks (not started with learner.ranks > 1?)")
        rank = rng.choice(sorted(ranks))
        os.kill(ranks[rank], signal.SIGKILL)
        self.kills += 1
        self.killed["learner-rank"] += 1
        return rank

    def learner_runs_expected(self) -> int:
        """Learner runs once every kill was recovered from: each learner or rank kill starts another."""
        return self.killed["learner"] + self.killed["learner-rank"] + 1

    def kill_random(self, rng: random.Random, stage: str | None = None) -> Process:
        candidates = [p for p in self.running if stage is None or p.stage == stage]
        victim = rng.choice(candidates)
        self.kill(victim)
        return victim

    def check_alive(self) -> None:
        """Restart a process that died by itself (and say so: that is a bug the drill found)."""
        for process in list(self.running):
            code = process.proc.poll()
            if code is not None and not (process.stage == "learner" and code == 0):
                print(f"{process.name} exited with {code} by itself; restarting it (log {process.log})", flush=True)
                self.running.remove(process)
                self.running.append(self.spawn(process.stage, process.index))
                self.restarts += 1

    def stop(self, stages: tuple[str, ...] = STAGES, timeout_s: float = 30.0) -> None:
        """SIGTERM the processes of ``stages`` (they commit and exit), SIGKILL what is left."""
        from rollstream.lifecycle import terminate

        doomed = [p for p in self.running if p.stage in stages]
        terminate([p.proc for p in doomed], timeout_s)
        for process in doomed:
            self.running.remove(process)


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """The learner ranks a torchrun launcher (``rollstream learner --nproc N`` becomes one) started:
    rank -> pid, from /proc (its children, with RANK in their environment). Linux only."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = int(entry.name)
    return ranks


@dataclass
class Accounting:
    issued: int
    trained: int  # distinct groups trained in the surviving lineage
    filtered: int
    stale: int
    invalid: int
    dropped_by_stream: int
    dead_lettered: int  # groups with a prompt or an action on a dead-letter topic
    lost: list[str]
    duplicate_trained: list[str]
    learner_runs: int
    continued: int = 0  # episode turns that were continued (multi-turn)
    fates: list[Any] = field(default_factory=list, repr=False)  # every fate read, of every learner run

    def figures(self) -> dict[str, Any]:
        return {"groups_issued": self.issued, "groups_trained": self.trained, "groups_filtered": self.filtered,
                "groups_stale": self.stale, "groups_dropped_by_stream": self.dropped_by_stream,
                "groups_dead_lettered": self.dead_lettered,
                "lost_groups": len(self.lost), "duplicate_trained_groups": len(self.duplicate_trained),
                "learner_runs": self.learner_runs, "turns_continued": self.continued}


def surviving_fates(fates: list[Any]) -> list[Any]:
    """The fates of the surviving model lineage (see the module doc)."""
    runs: dict[str, list[Any]] = {}
    for fate in sorted(fates, key=lambda f: f.decided_at):
        runs.setdefault(fate.learner_run, []).append(fate)
    ordered = sorted(runs.values(), key=lambda fs: fs[0].decided_at)
    kept: list[Any] = []
    for i, run in enumerate(ordered):
        if i + 1 < len(ordered):
            resumed_at = min(f.step - 1 if f.fate == "trained" else f.step for f in ordered[i + 1])
            run = [f for f in run if f.step <= resumed_at]
        kept += run
    return kept


async def account(config: Config) -> Accounting:
    """Every issued group's fate, from the topics (and the stream's set of dropped groups)."""
    from rollstream.errors import KafkaError
    from rollstream.kafka import read_to_end, topic_name
    from rollstream.redis import connect, key
    from rollstream.schemas import GroupFate, PromptIssued, SchemaError, codec

    issued: set[str] = set()
    continued: set[tuple[str, int, int]] = set()  # multi-turn: (group, sample, turn) sent back for another turn
    for record in await read_to_end(config.infra, topic_name(config.infra, "prompts")):
        try:
            prompt = codec(PromptIssued).decode(record.value)
        except SchemaError:
            continue
        issued.add(prompt.group_id)
        if prompt.continuation is not None:
            continued.add((prompt.group_id, prompt.continuation.sample_index, prompt.continuation.turn))
    dead_lettered: set[str] = set()  # a prompt or action on a DLQ (with its reason): its group never completes
    for name in ("prompts.dlq", "actions.dlq"):
        try:
            records = await read_to_end(config.infra, topic_name(config.infra, name), timeout_s=30)
        except KafkaError:  # the topic was never created: nothing was dead-lettered there
            continue
        dead_lettered |= {r.key.decode(errors="replace") for r in records if r.key}
    fates = []
    for record in await read_to_end(config.infra, topic_name(config.infra, "fates")):
        fates.append(codec(GroupFate).decode(record.value))
    client = connect(config.infra.redis_url)
    try:
        dropped = {m.decode() if isinstance(m, bytes) else m
                   for m in await client.smembers(key(config.infra, "progress:groups_dropped"))}
    finally:
        await client.aclose()
    lineage = surviving_fates(fates)
    trained = Counter(f.group_id for f in lineage if f.fate == "trained")
    # decided in the surviving lineage: a dead learner run's fates after its successor's resume point
    # were undone, and count again only once the successor has decided those groups anew
    decided = {f.group_id for f in lineage if f.fate != "duplicate"}
    by_kind = Counter(f.fate for f in lineage)
    return Accounting(
        issued=len(issued), trained=len(trained), filtered=by_kind["filtered"], stale=by_kind["stale"],
        invalid=by_kind["invalid"], dropped_by_stream=len(dropped & issued),
        dead_lettered=len(dead_lettered & issued), lost=sorted(issued - decided - dropped - dead_lettered), duplicate_trained=sorted(g for g, n in trained.items() if n > 1),
        learner_runs=len({f.learner_run for f in fates}), continued=len(continued), fates=fates)


async def wait_drained(config: Config, timeout_s: float, learner_runs: int = 1) -> Accounting:
    """Account until nothing is lost (every issued group decided in the surviving lineage) and at
    least ``learner_runs`` learner runs have published fates (a learner killed k times runs k + 1
    times: until its last run speaks, the lineage cannot tell what the dead one undid), or
    ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await account(config)
        if (not result.lost and result.learner_runs >= learner_runs) or time.monotonic() > deadline:
            return result
        await asyncio.sleep(2.0)


class PrivateRedis:
    """A Redis server of the drill's own, with append-only persistence (``appendfsync always``), so
    that it can be killed and restarted without losing an acknowledged write."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        with open(self.directory / "redis.log", "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        import redis as redis_sync

        client = redis_sync.Redis(port=self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis_sync.exceptions.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()
