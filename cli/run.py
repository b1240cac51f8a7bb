"""``rollstream run``: the whole pipeline on one machine, as separate processes.

Brings up the local infrastructure (unless endpoints are configured), creates the topics,
starts learner, stream, executor(s), generator(s) and sampler as child processes of this
one (each with its own log), prints progress, and when the learner has taken
``--max-steps`` optimizer steps stops everything it started, by pid. Each run gets its own
topic and key prefix, so runs never see each other's events or state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollstream import cpus, infra
from rollstream.config import Config
from rollstream.config_load import load_config, profile_path
from rollstream.errors import ConfigError
from rollstream.schemas.stages import RUN_ORDER, SPECS

# A short run that fits a 2-core CPU machine (rollstream/profiles/quick.toml), unless the user
# names another profile; anything the user sets wins over the profile.
PROFILE = "quick"
PROGRESS_EVERY_S = 30.0  # a progress line when no learner step came for this long


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_port: int
    argv: list[str] = field(default_factory=list)  # its `rollstream` arguments (a restart reuses them)
    restarts: int = 0
    env: dict[str, str] | None = None  # its environment (a restart reuses it)


def _docker_image_present(image: str) -> bool:
    try:
        result = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def register(name: str, p: argparse.ArgumentParser) -> Any:
    p.add_argument("--max-steps", type=int, default=4, help="optimizer steps to train (default 4)")
    p.add_argument("--max-minutes", type=float, default=0.0,
                   help="also stop after this many minutes from the start of the run: the learner finishes "
                        "its step, checkpoints and exits (default 0: no time limit)")
    p.add_argument("--executors", type=int, default=1, help="executor processes")
    p.add_argument("--generators", type=int, default=1, help="generator processes")
    p.add_argument("--learner-ranks", type=int, default=1, metavar="N",
                   help="learner ranks (torchrun; learner.parallel, fsdp unless set); default 1")
    p.add_argument("--keep-infra", action="store_true", help="leave the local broker/Redis running afterwards")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="start the evaluator: held-out pass@1 per family of every N-th policy version and of "
                        "the last (eval.every_versions; on the evals topic, the status line and the plot)")
    p.add_argument("--placement", choices=["split", "none"], default="split",
                   help="split (default): the learner and the generator get disjoint CPU cores when both run "
                        "torch on this CPU (rollstream/cpus.py); none: the kernel places them")
    return lambda args, config: run_pipeline(config, args)


def run_pipeline(config: Config, args: argparse.Namespace) -> int:
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    base = Path(config.infra.state_dir).resolve()
    run_dir = base / "runs" / run_id
    profile = str(profile_path(args.profile or PROFILE))
    every = getattr(args, "eval_every", None)
    overrides = [
        *args.overrides,
        *([f"eval.every_versions={every}"] if every is not None else []),
        f"learner.max_steps={args.max_steps}",
        f"infra.state_dir={base}",
        f"infra.topic_prefix={config.infra.topic_prefix}{run_id}.",
        f"infra.key_prefix={config.infra.key_prefix}{run_id}:",
        f"learner.checkpoint.dir={run_dir / 'checkpoints'}",
        f"archive.url={run_dir / 'archive'}",
    ]
    resolved = load_config(args.config, overrides, profile=profile)
    ranks = getattr(args, "learner_ranks", 1)
    if ranks > 1:  # several learner ranks (torchrun, started by `rollstream learner --nproc`)
        overrides.append(f"learner.ranks={ranks}")
        if resolved.learner.parallel == "none":
            overrides.append("learner.parallel=fsdp")
        resolved = load_config(args.config, overrides, profile=profile)
    if getattr(args, "placement", "split") == "split":
        placed, said = cpus.split(resolved, sorted(cpus.available()), generators=args.generators,
                                  learner_ranks=ranks)
        if placed:
            overrides += placed
            resolved = load_config(args.config, overrides, profile=profile)
        print(said)
    if resolved.eval.every_versions > 0 and not resolved.sampler.holdout_fraction and not resolved.eval.sources:
        raise ConfigError("--eval-every evaluates tasks the run never trains on: set sampler.holdout_fraction "
                          "(e.g. --set sampler.holdout_fraction=0.2: the sampler then holds those tasks out) or "
                          "eval.sources")
    if not _docker_image_present(resolved.executor.image):
        raise ConfigError(
            f"sandbox image {resolved.executor.image!r} not found: build it with "
            "`rollstream sandbox build --offline` (or set executor.image)"
        )
    was_up = infra.local_endpoints(resolved.infra) is not None
    state = infra.up(resolved.infra)  # what is configured and answers is used, the rest started
    # Resolved once, here: every child gets the endpoints explicitly.
    overrides += [f"infra.kafka_bootstrap={state['kafka_bootstrap']}", f"infra.redis_url={state['redis_url']}"]
    resolved = load_config(args.config, overrides, profile=profile)
    print(f"run {run_id}: kafka {resolved.infra.kafka_bootstrap}, redis {resolved.infra.redis_url}, logs {run_dir}")
    from rollstream.kafka import ensure_topics
    from rollstream.schemas import TOPICS

    asyncio.run(ensure_topics(resolved.infra, list(TOPICS)))
    children: list[Child] = []
    record = RunRecord(run_dir, run_id, resolved, heldout_digest(resolved))
    if resolved.eval.every_versions > 0:  # the evaluator checks that it evaluates the split the run trains around
        overrides.append(f"eval.heldout_digest={record.data['heldout_digest']}")
        resolved = load_config(args.config, overrides, profile=profile)
    # Every child starts from the resolved config the run writes down (run_dir/config.toml, what
    # `rollstream config show --run RUN` prints), plus only what differs per process.
    config_file, child_env = write_run_config(resolved, run_dir)
    cli_args = ["--config", str(config_file)]
    code = 1
    # SIGTERM (docker stop, systemd, a CI job's cancel, `timeout`) stops the run as Ctrl-C does:
    # the children run in sessions of their own, so without this they would outlive it.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        counts = {"archiver": int(resolved.archive.enabled), "executor": args.executors,
                  "generator": args.generators, "evaluator": int(resolved.eval.every_versions > 0)}
        for stage in RUN_ORDER:  # every consumer before what feeds it (schemas/stages.py)
            for i in range(counts.get(stage, 1)):
                port = infra.free_port()  # each process serves its metrics: the status line reads them
                section = SPECS[stage].section
                extra = ["--nproc", str(ranks)] if stage == "learner" and ranks > 1 else []
                if stage == "evaluator":
                    extra = [a for o in evaluator_overrides(resolved, run_id) for a in ("--set", o)]
                children.append(spawn_stage(stage, i, [*cli_args, "--set", f"{section}.metrics_port={port}", *extra],
                                       run_dir, port, child_env))
        code = _supervise(resolved, children, run_dir, max_minutes=args.max_minutes)
        return code
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop below is bounded (SIGKILL after 30 s)
        # A reader gone (the terminal or the bench that read this output killed: EPIPE) must not cut
        # the cleanup short: the broker and the run's Redis keys would be left behind.
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = ReaderMayBeGone(sys.stdout), ReaderMayBeGone(sys.stderr)
        try:
            _stop_all(children)
            if resolved.archive.enabled:
                _check_archive(resolved)
            record.finish(code)
            asyncio.run(_delete_run_keys(resolved))
            if not was_up and not args.keep_infra:
                infra.down(resolved.infra)
        finally:
            signal.signal(signal.SIGTERM, previous)
            sys.stdout, sys.stderr = streams


CONFIG_FILE = "config.toml"  # the resolved config of a run, in its run directory
# A URL's password (scheme://user:password@host): never written to the run directory.
_URL_SECRET = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/@\s]*:[^/@\s]+)@")


def write_run_config(config: Config, run_dir: Path) -> tuple[Path, dict[str, str]]:
    """Write the run's resolved config to ``run_dir/config.toml``, passwords in URLs replaced by
    ``***``; returns its path and the environment the run's processes start with: this one's,
    without the ``ROLLSTREAM_*`` variables (the file holds what they resolved to, and they would
    otherwise override the run's own settings), plus one variable per password left out."""
    from rollstream.config_load import ENV_PREFIX, to_toml

    run_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) and k != "ROLLSTREAM_CONFIG"}
    lines, section = [], ""
    for line in to_toml(config).splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        key, sep, value = line.partition(" = ")
        if sep and value.startswith('"'):
            text = json.loads(value)
            if isinstance(text, str) and _URL_SECRET.match(text):
                env[ENV_PREFIX + f"{section}.{key}".upper().replace(".", "__")] = json.dumps(text)
                line = f"{key} = {json.dumps(_URL_SECRET.sub(lambda m: m.group(1) + '***@', text))}  # password left out"
        lines.append(line)
    path = run_dir / CONFIG_FILE
    path.write_text("# The resolved config of this run (rollstream run): every process of the run started from it.\n"
                    + "\n".join(lines) + "\n")
    return path, env


def heldout_digest(config: Config) -> str:
    """The digest of the held-out task ids of the run's split ("" without one)."""
    from rollstream.evaluator.report import task_digest
    from rollstream.evaluator.stage import heldout_split

    held_out, _ = heldout_split(config) if config.sampler.holdout_fraction > 0 else ([], [])
    return task_digest(t.task_id for t in held_out) if held_out else ""


def evaluator_overrides(config: Config, run_id: str) -> list[str]:
    """What the run's evaluator gets besides the run's settings: a sandbox pool of its own (an
    owner label of its own, one container), one torch thread; it also lowers its own CPU priority
    (eval.nice), so it takes what the generator and the learner leave."""
    owner = f"{config.executor.owner}-evaluator-{run_id}"
    return ["eval.threads=1" if not config.eval.threads else f"eval.threads={config.eval.threads}",
            f"executor.owner={owner}", "executor.pool_size=1"]


class ReaderMayBeGone:
    """A text stream whose writes stop, silently, once its reader has gone (a broken pipe)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.inner.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.inner.flush()
            except (BrokenPipeError, ValueError):
                self.gone = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def spawn_stage(stage: str, index: int, cli_args: list[str], run_dir: Path, metrics_port: int,
                env: dict[str, str] | None = None, *, name: str = "") -> Child:
    """Start ``rollstream STAGE CLI_ARGS`` in a session of its own, its output in ``run_dir/NAME.log``
    (by default ``STAGE-INDEX`` for the stages ``rollstream run`` scales out, ``STAGE`` for the
    others): the one way a stage process is started, by ``rollstream run`` and by the chaos drills
    (cli/chaos.py)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    name = name or (f"{stage}-{index}" if stage in ("executor", "generator") else stage)
    log = run_dir / f"{name}.log"
    argv = [sys.executable, "-m", "rollstream.cli", stage, *cli_args]
    with open(log, "ab") as out:
        out.write(f"$ {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    print(f"started {name} (pid {proc.pid}), log {log}")
    return Child(name, proc, log, metrics_port, [stage, *cli_args], env=env)


def _supervise(config: Config, children: list[Child], run_dir: Path, *, max_minutes: float = 0.0) -> int:
    """Wait for the learner to finish; meanwhile a status line per learner step (and a progress
    line while none comes), the run's metrics.jsonl; at the end a summary and a plot. With
    ``max_minutes`` the learner is sent SIGTERM when they are up: it finishes its step,
    checkpoints and exits 0, and the run ends as if that step had been the last."""
    from rollstream.cli.watch import Watcher

    learner = next(c for c in children if c.name == "learner")
    watcher = Watcher(Path(config.learner.checkpoint.dir) / "steps.jsonl", run_dir, config.learner.max_steps,
                      [c.metrics_port for c in children], echo=lambda line: print(_stamp(line), flush=True),
                      max_seconds=max_minutes * 60)
    try:
        return _watch(config, children, learner, watcher, run_dir, max_minutes)
    except KeyboardInterrupt:  # the caller's finally stops every child (the learner checkpoints)
        watcher.poll()
        print(f"interrupted after {len(watcher.records)} steps")
        if watcher.records:
            _summarise(watcher, run_dir)
        return 130


def _summarise(watcher: Any, run_dir: Path) -> None:
    """The summary table of the steps so far and, when there are any, where their metrics and plot are."""
    from rollstream.cli.watch import PLOT_FILE, plot, summary

    print(summary(watcher.records, watcher.evals))
    if watcher.records and Path(watcher.out).exists():  # (a stop can come before the first line is written)
        print(f"metrics: {watcher.out}; plot: {plot([run_dir], run_dir / PLOT_FILE)}")


def _watch(config: Config, children: list[Child], learner: Child, watcher: Any, run_dir: Path,
           max_minutes: float) -> int:
    last_news = time.monotonic()
    deadline = time.monotonic() + max_minutes * 60 if max_minutes > 0 else None
    while True:
        if deadline is not None and time.monotonic() > deadline and learner.proc.poll() is None:
            print(_stamp(f"{max_minutes:g} minutes are up: the learner finishes its step, checkpoints and stops"),
                  flush=True)
            learner.proc.send_signal(signal.SIGTERM)
            deadline = None
        if watcher.poll():
            last_news = time.monotonic()
        for child in children:
            code = child.proc.poll()
            if code is None:
                continue
            if child is learner and code == 0:
                watcher.poll()
                print(f"learner finished {len(watcher.records)} steps")
                _await_final_evaluation(config, children, watcher)
                _summarise(watcher, run_dir)
                print(f"checkpoints: {config.learner.checkpoint.dir}")
                return 0
            if child is learner and child.restarts < config.learner.max_restarts:
                # The learner is restarted, not the run: it resumes from its last checkpoint (several
                # ranks: torchrun restarted them already; this is the launcher's own failure, or one rank's).
                learner = _restart_learner(child, children, run_dir)
                print(_stamp(f"learner exited with {code}; restarted with --resume ({learner.restarts} of "
                             f"{config.learner.max_restarts})"), flush=True)
                break
            print(f"{child.name} exited with {code}; stopping the run. Last lines of {child.log}:")
            _print_tail(child, 30)
            return 1
        if time.monotonic() - last_news > PROGRESS_EVERY_S:
            print(_stamp(asyncio.run(_progress(config))), flush=True)
            last_news = time.monotonic()
        time.sleep(0.5)


def _await_final_evaluation(config: Config, children: list[Child], watcher: Any) -> None:
    """With an evaluator that evaluates the learner's last version on the whole held-out split:
    wait for its report (or for it to exit, or ``eval.final_timeout_s``), printing progress."""
    evaluator = next((c for c in children if c.name == "evaluator"), None)
    last = config.learner.max_steps
    if evaluator is None or not config.eval.final or not last:
        return
    deadline = time.monotonic() + config.eval.final_timeout_s
    print(_stamp(f"waiting for the evaluator's report on version {last} (the whole held-out split; at most "
                 f"{config.eval.final_timeout_s:.0f} s)"), flush=True)
    next_line = time.monotonic() + PROGRESS_EVERY_S
    while time.monotonic() < deadline and evaluator.proc.poll() is None:
        watcher.poll_evals()
        if any(e.get("version") == last for e in watcher.evals):
            return
        if time.monotonic() > next_line:
            print(_stamp(f"evaluator still on version {last}"), flush=True)
            next_line = time.monotonic() + PROGRESS_EVERY_S
        time.sleep(1.0)
    print(_stamp(f"no report on version {last} from the evaluator ("
                 f"{'it exited' if evaluator.proc.poll() is not None else 'timed out'})"), flush=True)


def _restart_learner(old: Child, children: list[Child], run_dir: Path) -> Child:
    stage, *cli_args = old.argv
    args = cli_args if "--resume" in cli_args else [*cli_args, "--resume"]
    new = spawn_stage(stage, 0, args, run_dir, old.metrics_port, old.env)
    new.restarts = old.restarts + 1
    children[children.index(old)] = new
    return new


def _stamp(line: str) -> str:
    return f"[{time.strftime('%H:%M:%S')}] {line}"


async def _progress(config: Config) -> str:
    from rollstream.redis import connect, progress

    client = connect(config.infra.redis_url)
    try:
        counts = await progress(client, config.infra)
    except Exception as exc:  # progress is best effort; the run goes on
        return f"progress unavailable: {exc}"
    finally:
        await client.aclose()
    dropped = ", ".join(f"{reason} {n}" for reason, n in counts["dropped"].items())
    return (f"policy version {counts['version']}/{config.learner.max_steps}: groups issued {counts['issued']}, "
            f"trained {counts['trained']}, filtered {counts['filtered']}, dropped {sum(counts['dropped'].values())}"
            + (f" ({dropped})" if dropped else ""))


def _print_tail(child: Child, lines: int, only: str = "") -> None:
    try:
        text = [line for line in child.log.read_text(errors="replace").splitlines() if only in line][-lines:]
    except OSError:
        return
    for line in text:
        print(f"  {child.name}| {line}")


def _stop_all(children: list[Child]) -> None:
    """SIGTERM every child (they commit and exit), SIGKILL what is left after 30 s; the archivers
    last, once nothing writes any more, so that they archive every record of the run."""
    stages = [c for c in children if not c.name.startswith("archiver")]
    archivers = [c for c in children if c.name.startswith("archiver")]
    from rollstream.lifecycle import terminate

    terminate([c.proc for c in reversed(stages)])  # producers first, so downstream can drain
    terminate([c.proc for c in archivers], timeout_s=60)


def _check_archive(config: Config) -> None:
    """Compare the archive with the broker and say whether it holds every record of the run."""
    from rollstream.archive import ArchiveStore
    from rollstream.consumers.archiver.stage import check_complete

    store = ArchiveStore(config.archive.url)
    try:
        report = asyncio.run(check_complete(config, store))
    except Exception as exc:  # the run is over either way; say what could not be checked
        print(f"archive {store.root}: could not be checked against the broker: {exc}")
        return
    missing = [f"{t}[{p}]" for t, parts in report["topics"].items() for p, v in parts.items() if not v["complete"]]
    state = "complete" if report["complete"] else f"INCOMPLETE (behind on {', '.join(missing[:8])})"
    print(f"archive {store.root}: {report['records']} records, {state}")


class RunRecord:
    """``run.json`` in the run directory: what ``rollstream runs`` lists (the run's id, prefixes,
    start and end, exit status, the digest of its held-out split); the archive holds the rest."""

    def __init__(self, run_dir: Path, run_id: str, config: Config, heldout: str = "") -> None:
        self.path = run_dir / "run.json"
        self.data: dict[str, Any] = {
            "run_id": run_id, "started_at": time.time(), "ended_at": None, "exit_code": None,
            "topic_prefix": config.infra.topic_prefix, "key_prefix": config.infra.key_prefix,
            "max_steps": config.learner.max_steps, "archive": config.archive.url if config.archive.enabled else None,
            "checkpoints": config.learner.checkpoint.dir, "heldout_digest": heldout,
            "holdout": {"fraction": config.sampler.holdout_fraction, "seed": config.sampler.holdout_seed,
                        "sources": list(config.sampler.sources)}}
        self.write()

    def finish(self, code: int) -> None:
        self.data.update(ended_at=time.time(), exit_code=code)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")


async def _delete_run_keys(config: Config) -> None:
    from rollstream.redis import connect, delete_prefix

    client = connect(config.infra.redis_url)
    try:
        await delete_prefix(client, config.infra.key_prefix)
    finally:
        await client.aclose()
