"""Scoring one completion through a sandbox, and `rollstream score` (offline, no Kafka).

Consumes: a RewardSpec and a completion (the executor), or JSONL files (the CLI). Produces: a
:class:`Evaluation` (reward, components, execution record, and the raw RunResult with the
audit record built from it), or one JSON verdict per input line. The executor and the CLI share
:func:`evaluate`, so a reward debugged offline is the reward the learner gets.

Input of ``rollstream score``:

* ``TASKS.jsonl COMPLETIONS.jsonl``: tasks are TaskSpec lines (schemas/tasks.py); each completion
  line is ``{"task_id": ..., "completion": "..."}`` (any extra keys, e.g. ``"id"``, are echoed),
  or a bare JSON string / an object without ``task_id``, which pairs with the task on the same
  line number.
* ``PAIRS.jsonl``: each line ``{"task": {TaskSpec}, "completion": "..."}``.

Output: per input completion, in input order, ``{"line", "task_id", "reward", "components",
"execution": {ExecutionRecord}, "outcome", ...echoed keys}`` (``"lost"``: the causes of runs the
sandbox machinery lost, when any) or ``{"line", "error"}`` for a bad line. With a key configured
(``executor.attest``) each verdict carries its ``attestation`` (``rollstream verify --scores OUT``
checks them); a configured key that cannot be read stops it before anything is scored.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec

from rollstream.attest import Signer, code_digest, load_signer, spec_digest
from rollstream.config import Config
from rollstream.consumers.executor.jobs import Job, RunResult, SandboxBackend, sandbox_identity
from rollstream.consumers.executor.reference import ReferenceCheck, ReferenceChecks, log_check
from rollstream.consumers.executor.rewards import (
    NO_REFERENCE,
    AnswerKind,
    RewardRegistry,
    Scored,
    default_registry,
    extract_code,
)
from rollstream.errors import ConfigError, SandboxError, SandboxLost
from rollstream.retry import retry
from rollstream.schemas.events import Connection, ExecutionRecord, RewardSpec, SandboxAudit, SandboxLimits
from rollstream.schemas.tasks import TaskSpec, decode_task

SANDBOX_ATTEMPTS = 3
log = logging.getLogger(__name__)


class Evaluation(msgspec.Struct, frozen=True, kw_only=True):
    scored: Scored
    job: Job | None = None  # None: decided without running anything
    result: RunResult | None = None
    reference: ReferenceCheck | None = None  # what the task's reference said (when it has one)
    lost: list[str] = []  # the causes (SandboxLost.cause) of the runs the machinery lost, retried or not


def infra_scored(message: str) -> Scored:
    """The score of a job the machinery failed under every time it was run: no reward, outcome
    ``infra`` (the stream leaves the rollout out of its group)."""
    record = ExecutionRecord(sandbox_id="", exit_code=None, duration_s=0.0, error_kind="infra",
                             error_message=message[:4096])
    return Scored(reward=0.0, components={}, execution=record)


async def evaluate(
    backend: SandboxBackend,
    registry: RewardRegistry,
    spec: RewardSpec,
    completion: str,
    job_id: str,
    *,
    attempts: int = SANDBOX_ATTEMPTS,
    max_timeout_s: float | None = None,
    files: Sequence[tuple[str, bytes]] = (),
    collect_files: bool = False,
    references: ReferenceChecks | None = None,
    task_id: str = "",
) -> Evaluation:
    """Score ``completion`` against ``spec`` in ``backend``, with at most ``max_timeout_s`` of
    wall-clock time whatever the spec asks for (the executor's ``max_timeout_s``). With
    ``references``, a task that carries its reference is checked once (consumers/executor/reference.py):
    its plain calls go with the job, and ``trust = "auto"`` is decided.

    A job the machinery fails under (SandboxLost: the container, the engine or the runner lost
    mid-job) runs again on a fresh container, ``attempts`` times in all; if every run was lost the
    evaluation's outcome is ``infra`` (no reward), with the causes in ``lost``.

    Raises ValueError for a spec the registry rejects (the caller dead-letters it) and
    SandboxError when the backend failed ``attempts`` times for reasons of its own before a job
    could be handed to a sandbox (no container can be started: the caller stops, uncommitted).
    """
    if max_timeout_s is not None and spec.timeout_s > max_timeout_s:
        spec = msgspec.structs.replace(spec, timeout_s=max_timeout_s)
    kind = registry.get(spec)
    if isinstance(kind, AnswerKind):  # no sandbox: checked by the kind's own workers (math_answer's pool)
        return Evaluation(scored=await kind.check(spec, completion))
    check = None
    if references is not None and spec.reference:
        check = await retry(functools.partial(references.check, spec, task_id), what=f"reference check of {job_id}",
                            retry_on=(SandboxError,), attempts=attempts, first_delay_s=0.5, max_delay_s=4.0)
    trust = check.trust(spec.trust) if check is not None else ("judge" if spec.trust == "auto" else spec.trust)
    strict_auto = spec.trust == "auto" and check is None  # no reference: auto is the judge's strictest reading
    if trust != spec.trust:
        spec = msgspec.structs.replace(spec, trust=trust)
    prepared = kind.prepare(spec, completion, job_id)
    if isinstance(prepared, Scored):
        return Evaluation(scored=prepared, reference=check)
    if isinstance(prepared, Job) and prepared.trust == "judge":
        rules = check.rules() if check is not None else {}
        if not rules and spec.returns_objects:
            rules = {"returns_objects": True}
        prepared = msgspec.structs.replace(prepared, rules=rules)
    if files or collect_files:  # a multi-turn episode: its workspace in, the files it leaves out
        prepared = msgspec.structs.replace(prepared, files=list(files), collect_files=collect_files)

    lost: list[str] = []

    async def once(job: Job) -> RunResult:
        try:
            return await backend.execute(job)
        except SandboxLost as exc:
            lost.append(exc.cause)
            log.warning("sandbox lost under %s (%s): %s", job.job_id, exc.cause, exc)
            raise

    async def run(job: Job) -> RunResult:
        return await retry(functools.partial(once, job), what=f"sandbox run of {job.job_id}",
                           retry_on=(SandboxError,), attempts=attempts, first_delay_s=0.5, max_delay_s=4.0)

    try:
        if trust == "mixed" and check is not None and isinstance(prepared, Job):
            # the tests the judge cannot honour (the reference fails them there) run in process; the
            # rest under the judge; the record names the former and what they lost
            in_process = msgspec.structs.replace(prepared, job_id=f"{job_id}/in-process", trust="in_process",
                                                 rules={}, collect_files=False)
            both = await asyncio.gather(run(prepared), run(in_process), return_exceptions=True)
            failed = [r for r in both if isinstance(r, BaseException)]
            if failed:
                raise next((e for e in failed if isinstance(e, SandboxLost)), failed[0])
            judged, alone = both
            result = merge_mixed(judged, alone, check.in_process_tests)
        else:
            result = await run(prepared)
    except SandboxLost as exc:
        message = f"the sandbox was lost under this job {len(lost)} time(s) ({', '.join(lost)}): {exc}"
        return Evaluation(scored=infra_scored(message), job=prepared, reference=check, lost=lost)
    scored = kind.score(spec, completion, result)
    if strict_auto and isinstance(prepared, Job) and prepared.trust == "judge" and not prepared.rules:
        # what auto lost: the reference's record, so the strict reading judged (its honest-form costs)
        execution = scored.execution
        scored = msgspec.structs.replace(scored, execution=msgspec.structs.replace(
            execution, lost_guarantees=[*execution.lost_guarantees, NO_REFERENCE]))
    return Evaluation(scored=scored, job=prepared, result=result, reference=check,
                      lost=lost)


def merge_mixed(judged: RunResult, alone: RunResult, in_process_tests: Sequence[int]) -> RunResult:
    """One result of a ``mixed`` task's two runs: the judge's, with the verdicts of the tests in
    ``in_process_tests`` from the in-process run (a test that run did not answer failed); the
    worse of the two for everything else (limits, violations)."""
    moved = set(in_process_tests)
    events = [e for e in judged.events if not (e.get("e") == "test" and e.get("i") in moved)]
    answered = {e.get("i") for e in alone.events if e.get("e") == "test"}
    events += [e for e in alone.events if e.get("e") == "test" and e.get("i") in moved]
    events += [{"e": "test", "i": i, "ok": False, "type": "FailedCall", "msg": "the in-process run gave no verdict"}
               for i in sorted(moved - answered)]
    return msgspec.structs.replace(
        judged, events=events, violations=judged.violations + [v for v in alone.violations if v not in judged.violations],
        timed_out=judged.timed_out or alone.timed_out, output_limit=judged.output_limit or alone.output_limit,
        oom_killed=judged.oom_killed or alone.oom_killed, runner_died=judged.runner_died or alone.runner_died,
        duration_s=max(judged.duration_s, alone.duration_s), in_process_tests=sorted(moved))


def audit_record(
    evaluation: Evaluation, limits: SandboxLimits, rollout_id: str, executed_at: float
) -> SandboxAudit | None:
    """The operator's record of one execution (None when nothing ran; a job every run of which the
    machinery lost has one with outcome ``infra``, its violations ``lost:<cause>`` per run)."""
    job, result = evaluation.job, evaluation.result
    if job is None:
        return None
    execution = evaluation.scored.execution
    job_limits = msgspec.structs.replace(
        limits, timeout_s=job.timeout_s, memory_mb=min(job.memory_mb, limits.memory_mb)
    )
    code_sha256 = hashlib.sha256(job.code.encode("utf-8", "surrogatepass")).hexdigest()
    if result is None:
        if execution.error_kind != "infra":
            return None
        return SandboxAudit(sandbox_id="", container_id="", rollout_id=rollout_id[:4096], code_sha256=code_sha256,
                            limits=job_limits, duration_s=0.0, output_bytes=0, verdict="infra",
                            violations=[f"lost:{cause}" for cause in evaluation.lost][:64], executed_at=executed_at,
                            outcome="infra")
    return SandboxAudit(
        sandbox_id=result.sandbox_id[:4096],
        container_id=result.container_id,
        rollout_id=rollout_id[:4096],
        code_sha256=code_sha256,
        limits=job_limits,
        duration_s=max(0.0, result.duration_s),
        output_bytes=result.output_bytes,
        verdict=execution.error_kind,
        violations=[v[:4096] for v in (result.violations + _tampering(evaluation) +
                                       [f"lost:{cause}" for cause in evaluation.lost])[:64]],
        recycled=result.recycled,
        executed_at=executed_at,
        outcome=execution.outcome,
        connections=connections(result.connections),
    )


def connections(records: list[dict[str, Any]]) -> list[Connection]:
    """The proxy's records of a job's connections, as the audit's (a record that does not read as one
    is kept as a denied connection to nowhere, never dropped in silence)."""
    kept = []
    for record in records[:1000]:
        try:
            kept.append(msgspec.convert(record, Connection))
        except (msgspec.ValidationError, TypeError):
            kept.append(Connection(host="", port=0, verdict="denied", reason=f"unreadable record: {record!r}"[:4096]))
    return kept


def _tampering(evaluation: Evaluation) -> list[str]:
    """``tamper:<kind>`` for each attack on the verdict the judge found."""
    tamper = evaluation.scored.execution.tamper
    return [f"tamper:{kind}" for kind in tamper.split(",")] if tamper else []


def read_inputs(paths: list[str]) -> Iterator[tuple[int, TaskSpec | None, str, dict[str, Any], str | None]]:
    """(line, task, completion, echoed keys, error) per completion, in input order."""
    if len(paths) == 2:
        tasks_path, completions_path = paths
        tasks = [_task(line) for line in _lines(tasks_path)]
        by_id = {t.task_id: t for t in tasks if isinstance(t, TaskSpec)}
        for number, line in enumerate(_lines(completions_path), 1):
            try:
                item = json.loads(line)
                if isinstance(item, str):
                    item = {"completion": item}
                if not isinstance(item, dict) or not isinstance(item.get("completion"), str):
                    raise ValueError('expected {"task_id": ..., "completion": "..."} or a JSON string')
                if "task_id" in item:
                    task = by_id.get(item["task_id"])
                    if task is None:
                        raise ValueError(f"no task with task_id {item['task_id']!r} in {tasks_path}")
                else:
                    task = tasks[number - 1] if number <= len(tasks) else None
                    if not isinstance(task, TaskSpec):
                        raise ValueError(f"task line {number} of {tasks_path} is missing or invalid")
            except ValueError as exc:
                yield number, None, "", {}, str(exc)
                continue
            echoed = {k: v for k, v in item.items() if k not in ("completion", "task")}
            yield number, task, item["completion"], echoed, None
    elif len(paths) == 1:
        for number, line in enumerate(_lines(paths[0]), 1):
            try:
                item = json.loads(line)
                if not isinstance(item, dict) or not isinstance(item.get("completion"), str):
                    raise ValueError('expected {"task": {...}, "completion": "..."}')
                task = msgspec.convert(item.get("task"), TaskSpec)
            except (ValueError, msgspec.ValidationError) as exc:
                yield number, None, "", {}, str(exc)
                continue
            echoed = {k: v for k, v in item.items() if k not in ("completion", "task")}
            yield number, task, item["completion"], echoed, None
    else:
        raise ValueError("give TASKS.jsonl COMPLETIONS.jsonl, or one JSONL of {task, completion}")


def _lines(path: str) -> list[str]:
    return [line for line in Path(path).read_text().splitlines() if line.strip()]


def _task(line: str) -> TaskSpec | str:
    try:
        return decode_task(line)
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        return str(exc)


def failed_test_lines(execution: dict[str, Any], shown: int = 3) -> list[str]:
    """A verdict's tests that did not pass, one line each, from its record's ``test_results``
    (``rollstream score`` on stderr, ``rollstream inspect``)."""
    results = execution.get("test_results") or []
    bad = [r for r in results if r.get("outcome") in ("failed", "error")]
    lines = [f"test {r['index']} {r['outcome']}" + (f" ({r['node_id']})" if r.get("node_id") else "")
             + f": {r.get('error_type') or ''}: {r.get('message') or ''}".rstrip(": ") for r in bad[:shown]]
    if len(bad) > shown:
        lines.append(f"... {len(bad) - shown} more tests failed")
    if execution.get("test_results_omitted"):
        lines.append(f"({execution['test_results_omitted']} tests' results not recorded: over the verdict's bound)")
    return lines


def verdict_json(line: int, task: TaskSpec, evaluation: Evaluation, echoed: dict[str, Any]) -> dict[str, Any]:
    scored = evaluation.scored
    out: dict[str, Any] = {"line": line, "task_id": task.task_id, **echoed}
    out.update(
        reward=scored.reward, components=scored.components, execution=msgspec.to_builtins(scored.execution),
        outcome=scored.execution.outcome,
    )
    if evaluation.lost:
        out["lost"] = evaluation.lost
    if evaluation.result is not None:
        out["violations"] = evaluation.result.violations
    if evaluation.reference is not None:
        out["reference"] = msgspec.to_builtins(evaluation.reference)
    return out


async def score_main(config: Config, inputs: list[str], output: str = "-") -> int:
    """`rollstream score INPUTS... [-o OUTPUT]`: exit status 0 when every line was scored, 1 when
    some could not be (their verdict lines say why)."""
    if len(inputs) not in (1, 2):
        raise ConfigError(
            "rollstream score takes TASKS.jsonl COMPLETIONS.jsonl, or one JSONL of {task, completion}"
        )
    for path in inputs:
        if not Path(path).is_file():
            raise ConfigError(f"rollstream score: {path} does not exist")
    if output == "-":
        counts = await score_file(config, inputs, sys.stdout)
    else:
        with open(output, "w") as out:
            counts = await score_file(config, inputs, out)
    print(
        f"scored {counts['scored']} completions, {counts['errors']} lines could not be scored",
        file=sys.stderr,
    )
    return 0 if counts["errors"] == 0 else 1


async def score_file(
    config: Config,
    paths: list[str],
    out: IO[str] | None = None,
    *,
    backend: SandboxBackend | None = None,
    registry: RewardRegistry | None = None,
) -> dict[str, int]:
    """`rollstream score`: write one JSON verdict per completion to ``out`` (stdout), in input order.

    Starts a sandbox pool from ``config.executor`` unless ``backend`` is given or every task is an answer
    kind's (``math_answer``: checked by its worker pool, closed at the end with the registry made here). Returns counts
    ``{"scored": n, "errors": m}``; the CLI should exit non-zero when errors > 0.
    """
    out = out or sys.stdout
    owned = registry is None
    registry = registry or default_registry()
    try:
        return await _score_file(config, paths, out, backend, registry)
    finally:
        if owned:
            registry.close()  # the answer kinds' worker processes


async def _score_file(config: Config, paths: list[str], out: IO[str], backend: SandboxBackend | None,
                      registry: RewardRegistry) -> dict[str, int]:
    signer = load_signer(config.executor.attest)  # ConfigError (exit 2) when a configured key cannot be read
    if signer is not None:
        print(f"rollstream score: signing verdicts with key {signer.key_id}", file=sys.stderr)
    items = list(read_inputs(paths))
    if backend is None and not any(_sandboxed(registry, item[1]) for item in items):
        backend = NoSandbox()  # answers only (math_answer): no Docker needed
    if backend is None:
        from rollstream.consumers.executor.pool import DockerSandboxPool

        async with DockerSandboxPool(config.executor) as pool:
            return await _score_items(items, out, pool, registry, config.executor.concurrency,
                                      config.executor.max_timeout_s, signer)
    return await _score_items(items, out, backend, registry, config.executor.concurrency,
                              config.executor.max_timeout_s, signer)


class NoSandbox:
    """The backend of a `rollstream score` whose every task is an answer kind's: nothing runs in it."""

    image_id = "none"
    runtime = "none"

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(timeout_s=0.0, memory_mb=0, pids=0, cpus=0.0, output_bytes=0, tmpfs_mb=0)

    async def execute(self, job: Job) -> RunResult:
        raise SandboxError("no sandbox was started: these inputs' tasks are all checked without one")


def _sandboxed(registry: RewardRegistry, task: TaskSpec | None) -> bool:
    """Whether a task's completions run in a sandbox (an unknown kind: its line's error, say yes)."""
    if task is None:
        return False
    try:
        return not isinstance(registry.get(task.issued_reward()), AnswerKind)
    except ValueError:
        return True


def signed_verdict(signer: Signer, verdict: dict[str, Any], spec: RewardSpec, completion: str,
                   backend: SandboxBackend) -> dict[str, Any]:
    """A JSON verdict with its attestation, claiming what the executor's would (rollstream/attest.py)."""
    image, runtime = sandbox_identity(backend)
    return signer.sign_score(verdict, spec_sha256=spec_digest(spec),
                             code_sha256=code_digest(extract_code(completion, spec.language).code or ""), image=image,
                             runtime=runtime)


async def _score_items(
    items: list, out: IO[str], backend: SandboxBackend, registry: RewardRegistry, concurrency: int,
    max_timeout_s: float | None = None, signer: Signer | None = None,
) -> dict[str, int]:
    gate = asyncio.Semaphore(concurrency)
    def reported(task_id: str, check: ReferenceCheck) -> None:
        log_check(task_id, check)
        if check.mismatch:
            print(f"rollstream score: task {task_id}: its reference fails under the judge at test "
                  f"{check.failing_test} ({check.message}) but passes in process", file=sys.stderr)

    references = ReferenceChecks(backend, reported=reported)

    async def one(line: int, task: TaskSpec | None, completion: str, echoed: dict, error: str | None) -> dict:
        if error is not None or task is None:
            return {"line": line, "error": error}
        spec = task.issued_reward()
        try:
            async with gate:
                evaluation = await evaluate(
                    backend, registry, spec, completion, f"{task.task_id}#{line}", max_timeout_s=max_timeout_s,
                    references=references, task_id=task.task_id,
                )
        except ValueError as exc:
            return {"line": line, "task_id": task.task_id, "error": str(exc)}
        verdict = verdict_json(line, task, evaluation, echoed)
        return verdict if signer is None else signed_verdict(signer, verdict, spec, completion, backend)

    tasks = [asyncio.ensure_future(one(*item)) for item in items]
    counts = {"scored": 0, "errors": 0}
    started = time.monotonic()
    try:
        for task in tasks:  # in input order, each line as soon as it and those before it are done
            verdict = await task
            counts["errors" if "error" in verdict else "scored"] += 1
            out.write(json.dumps(verdict) + "\n")
            out.flush()
            for text in failed_test_lines(verdict.get("execution") or {}):  # for the reader; stdout stays JSON
                print(f"line {verdict['line']} ({verdict.get('task_id')}): {text}", file=sys.stderr)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    counts["seconds"] = int(time.monotonic() - started)
    return counts
