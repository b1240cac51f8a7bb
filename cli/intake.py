"""``rollstream tasks check SOURCE [...] [--quick] [--json OUT]``: every task checked before it can
reward anything.

Through the executor's warm sandbox pool (``consumers/executor/pool.py``) and its scoring
(``consumers/executor/score.py``), exactly as the executor would score a completion:

* the reference passes every visible test and every held-out test;
* every wrong solution the task carries fails at least one visible test;
* mutants of the reference (``rollstream/tasks/mutants.py``) are killed by the visible tests: the
  mutation score is killed / (run - possibly equivalent); survivors are checked against the
  reference on varied inputs taken from the tests' own calls;
* trivial programs (``rollstream/tasks/trivial.py``: return an argument, a constant of the tests,
  the empty value of the result's type) fail them: one that passes every test and differs from
  the reference on a varied input makes the task's tests weak, with that program named.

A ``math_answer`` task runs nothing: its gold answer is read as the executor reads it (found, within
the executor's bounds, not a placeholder such as ``proof``) and parsed by the executor's answer pool
(``consumers/executor/answers.py``, a worker under its time and memory limits): one that does not
parse is ``answer_does_not_parse``; a reference solution with a marked answer (``#### n``, a last
``\\boxed{}``) must reach the same answer, and each wrong solution must not (read as the executor
reads a completion). No sandbox is started when every task is one.

And without the sandbox (``rollstream/tasks/intake.py``): duplicate clusters, contamination by
the evaluation sets in use (the held-out split of ``sampler.holdout_fraction``, HumanEval, every
``eval.sources``), personal data and secrets in prompts and tests.

Writes the intake report the sampler reads (``intake.report``, merged by task digest), prints a
summary table per family and the failing tasks with their reasons; ``--json OUT`` writes this
run's checks. Exit status 0 when every task passes, 1 when some fail.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from rollstream.config import Config
from rollstream.consumers.executor.answers import (
    MAX_ANSWER_CHARS,
    MAX_CHECK_S,
    MAX_NESTING,
    MathAnswer,
    MathPool,
    PoolError,
    boxed,
    gold_answer,
    nesting,
    refusal,
    typography,
)
from rollstream.consumers.executor.jobs import SandboxBackend
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.consumers.executor.rewards import RewardRegistry, default_registry
from rollstream.consumers.executor.score import NoSandbox, evaluate
from rollstream.errors import ConfigError
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks import mutants as mutation
from rollstream.tasks import trivial
from rollstream.tasks.intake import (
    StaticChecks,
    Survivor,
    TaskCheck,
    TrivialSurvivor,
    completion_parameters,
    digest,
    reasons_of,
    report_path,
    save_report,
    static_checks,
)
from rollstream.tasks.sources import humaneval_tasks, load_tasks, split_tasks

QUICK_MUTANTS = 6
SURVIVORS_SHOWN = 3
MATH_KIND = "math_answer"
# Gold answers that are no value (NuminaMath's proofs and unsolved problems): the CAS would read "proof"
# as a product of five symbols, and nothing a completion can box is that answer
PLACEHOLDERS = frozenset({"proof", "notfound", "not found", "none", "n/a", "na", "unknown"})


def fenced(code: str, language: str = "python") -> str:
    """``code`` as a completion in ``language`` would carry it: in a fence of its language's tag."""
    return f"```{language}\n{code}\n```\n"


class Sandbox:
    """The pool, the executor's reward rules and reference checks, and a gate on concurrency."""

    def __init__(self, pool: SandboxBackend, concurrency: int) -> None:
        self.pool = pool
        self.registry: RewardRegistry = default_registry()
        self.references = ReferenceChecks(pool)
        self.gate = asyncio.Semaphore(concurrency)
        self.executions = 0
        self.answers: MathPool | None = None  # the executor's answer pool, for math_answer tasks (run_checks')

    async def passes(self, spec: RewardSpec, code: str, job: str) -> tuple[bool, Any]:
        """(the code passed every test of ``spec``, its execution record)."""
        async with self.gate:
            evaluation = await evaluate(self.pool, self.registry, spec, fenced(code, spec.language), job,
                                        references=self.references if spec.reference else None, task_id=job)
        self.executions += 1
        execution = evaluation.scored.execution
        return execution.passed, evaluation


def _equivalence_checkable(task: TaskSpec) -> bool:
    """Whether a survivor can be compared with the reference by calling both: a function entry
    point whose result (not its printed output) is what the tests check."""
    spec = task.reward
    if not spec.entry_point or spec.program or not task.reference_solution:
        return False
    if any("redirect_std" in t for t in spec.tests):
        return False
    return f"def {spec.entry_point}(" in task.reference_solution


async def check_mutants(box: Sandbox, task: TaskSpec, spec: RewardSpec, limit: int, timeout_s: float
                        ) -> tuple[int, int, int, int, list[Survivor]]:
    """(mutants in all, run, killed, possibly equivalent, survivors)."""
    chosen, total = mutation.mutants(task.reference_solution or "", limit)
    spec = msgspec.structs.replace(spec, timeout_s=min(spec.timeout_s, timeout_s))
    results = await asyncio.gather(*(box.passes(spec, m.source, f"{task.task_id}/mutant-{i}")
                                     for i, m in enumerate(chosen)))
    survivors = [m for m, (passed, _) in zip(chosen, results) if passed]
    inputs: list = []
    if survivors and _equivalence_checkable(task):
        inputs = mutation.varied_arguments(mutation.call_arguments(list(task.reward.tests), spec.entry_point))
    judged = await asyncio.gather(*(_tells_apart(box, task, spec, m, inputs) for m in survivors))
    out = [Survivor(operator=m.operator, line=m.line, change=m.change, source=m.source,
                    possibly_equivalent=equivalent, tells_apart=apart) for m, (equivalent, apart) in zip(survivors, judged)]
    killed = len(chosen) - len(survivors)
    return total, len(chosen), killed, sum(s.possibly_equivalent for s in out), out


async def check_trivial(box: Sandbox, task: TaskSpec, spec: RewardSpec, timeout_s: float
                        ) -> tuple[int, list[TrivialSurvivor]]:
    """(trivial programs tried, those that pass every visible test and differ from the reference
    somewhere): rollstream/tasks/trivial.py. Each is decided without a sandbox when the tests
    allow, else run like a completion."""
    if spec.program or not spec.entry_point or not task.reference_solution:
        return 0, []
    tests = list(spec.tests)
    programs = trivial.trivial_programs(spec.entry_point, tests, task.reference_solution)
    decided = [trivial.decide(p, tests, spec.entry_point) for p in programs]
    undecided = [p for p, verdict in zip(programs, decided) if verdict is None]
    spec = msgspec.structs.replace(spec, timeout_s=min(spec.timeout_s, timeout_s))
    ran = await asyncio.gather(*(box.passes(spec, p.source, f"{task.task_id}/trivial-{i}")
                                 for i, p in enumerate(undecided)))
    passing = [p for p, verdict in zip(programs, decided) if verdict] + [p for p, (ok, _) in zip(undecided, ran) if ok]
    inputs: list = []
    if passing and _equivalence_checkable(task):
        inputs = mutation.varied_arguments(mutation.call_arguments(tests, spec.entry_point))
    judged = await asyncio.gather(*(_tells_apart(box, task, spec, p, inputs) for p in passing))
    return len(programs), [TrivialSurvivor(name=p.name, source=p.source, tells_apart=apart)
                           for p, (equivalent, apart) in zip(passing, judged) if not equivalent]


async def _tells_apart(box: Sandbox, task: TaskSpec, spec: RewardSpec, mutant: mutation.Mutant | trivial.Trivial,
                       inputs: list) -> tuple[bool, str]:
    """(the mutant agreed with the reference on every varied input, an input where it did not)."""
    if not inputs:
        return False, ""
    setup = f"{spec.setup}\n{mutation.renamed_reference(task.reference_solution or '')}"
    tests = mutation.equivalence_tests(spec.entry_point, inputs)
    check = msgspec.structs.replace(spec, setup=setup, tests=tests, reference="", all_or_nothing=False)
    passed, evaluation = await box.passes(check, mutant.source, f"{task.task_id}/equivalence")
    if passed:
        return True, ""
    result = evaluation.result
    failed = sorted(e["i"] for e in (result.events if result else []) if e.get("e") == "test" and e.get("ok") is not True
                    and isinstance(e.get("i"), int) and 0 <= e["i"] < len(inputs))
    return False, mutation.described_input(spec.entry_point, inputs[failed[0]]) if failed else ""


def judged(evaluation: Any) -> dict[str, Any]:
    """What the reference's run under the judge says of the task: every test skipped by the tests,
    and the tests that run in the completion's process (trust = "auto") with what they lose."""
    check, execution = evaluation.reference, evaluation.scored.execution
    if check is None:
        return {}
    return {"all_skipped": check.all_skipped, "in_process_tests": list(execution.in_process_tests),
            "lost_guarantees": list(execution.lost_guarantees)}


async def needs_reference(box: Sandbox, task: TaskSpec, spec: RewardSpec, reference: str) -> dict[str, Any]:
    """The tests the judge cannot judge without the task's reference: those the reference itself
    fails under the strictest reading, the one a spec without its reference gets (docs/executor.md,
    "Tasks without a reference"), with the first one's error."""
    strict = msgspec.structs.replace(spec, reference="", trust="judge")
    passed, evaluation = await box.passes(strict, reference, f"{task.task_id}/reference-strict")
    if passed or evaluation.result is None:
        return {}
    failed = sorted((e for e in evaluation.result.events if e.get("e") == "test" and e.get("ok") is not True
                     and not e.get("skip") and isinstance(e.get("i"), int)), key=lambda e: e["i"])
    failing = sorted({e["i"] for e in failed})
    message = next((f"{e.get('type')}: {e.get('msg', '')}" for e in failed), evaluation.scored.execution.error_message)
    return {"needs_reference": failing, "needs_reference_message": str(message)[:500]}


def gold_problem(answer: str) -> tuple[str, str]:
    """(the gold answer as the executor reads it, why no completion can match it or "") before any CAS:
    empty, over the executor's bounds (it would cut it), nested deeper than any answer it reads, a
    placeholder, a TeX macro."""
    gold = gold_answer(answer)
    if not gold:
        return gold, "empty once read"
    if len(gold) > MAX_ANSWER_CHARS:
        return gold, f"{len(gold)} characters (the executor reads {MAX_ANSWER_CHARS})"
    if nesting(gold) > MAX_NESTING:
        return gold, f"nested over {MAX_NESTING} levels (no answer that deep is read)"
    if gold.strip().lower() in PLACEHOLDERS:
        return gold, f"{gold.strip()!r} is a placeholder, not a value"
    why = refusal(gold)
    if why and "macro" in why:
        return gold, why
    return gold, ""


async def check_answer(pool: MathPool, task: TaskSpec) -> dict[str, Any]:
    """A math_answer task's gold answer checked (:func:`gold_problem`, then parsed by the pool: compared
    with itself, so it parses and is equal to itself), and its reference solution's marked answer
    (``#### n`` or a last ``\\boxed{}``) compared with it."""
    spec = task.reward
    timeout_s = min(spec.timeout_s, MAX_CHECK_S)
    gold, problem = gold_problem(spec.answer)
    found: dict[str, Any] = {}
    if not problem:
        text = typography(gold)[0]
        try:
            reply = await pool.call({"op": "check", "answer": text, "gold": text, "tolerance": None}, timeout_s)
        except PoolError as exc:
            reply = {"error": exc.kind, "message": str(exc)}
        if "error" in reply:
            problem = f"the CAS could not read it ({reply.get('message') or reply['error']})"
        elif not reply.get("gold_parsed") or reply.get("matched") is not True:
            problem = f"the CAS does not read it ({reply.get('reason')})"
    if problem:
        return {"answer_parses": False, "answer_message": f"answer does not parse: {gold[:200]!r}: {problem}"[:500]}
    found["answer_parses"] = True
    reference = task.reference_solution or ""
    if "####" in reference or boxed(reference):
        said = gold_answer(reference)[:MAX_ANSWER_CHARS]
        try:
            reply = await pool.call({"op": "check", "answer": typography(said)[0], "gold": typography(gold)[0],
                                     "tolerance": spec.answer_tolerance}, timeout_s)
        except PoolError as exc:
            reply = {"matched": False, "reason": str(exc)}
        found["reference_passes"] = reply.get("matched") is True
        found["reference_message"] = (f"the reference's answer {said[:200]!r} against the gold {gold[:200]!r}: "
                                      f"{reply.get('reason') or reply.get('message') or reply.get('error')}")[:500]
    passing = []
    for number, wrong in enumerate(task.wrong_solutions):  # each must score 0 on the answer, as the executor reads it
        try:
            scored = await MathAnswer(pool).check(task.issued_reward(), wrong)
        except PoolError:
            continue
        if scored.components.get("answer") == 1.0:
            passing.append(number)
    found["wrong_passing"] = passing
    return found


async def check_task(box: Sandbox, task: TaskSpec, static: StaticChecks, config: Config, limit: int) -> TaskCheck:
    """Every check of one task (the sandbox's runs, the static findings merged in)."""
    if task.reward.kind == MATH_KIND:
        if box.answers is None:  # started on the first math task; run_checks closes it
            box.answers = MathPool()
        found = await check_answer(box.answers, task)
        check = TaskCheck(task_id=task.task_id, family=task.family, digest=digest(task),
                          wrong_solutions=len(task.wrong_solutions), duplicates=static.duplicates.get(task.task_id, []),
                          contamination=static.contamination.get(task.task_id, []),
                          personal_data=static.personal_data.get(task.task_id, []), **found)
        return msgspec.structs.replace(check, reasons=reasons_of(check, config.intake))
    spec = task.issued_reward()
    reference = task.reference_solution or ""
    found: dict[str, Any] = {"params_from_completion": completion_parameters(
        spec.kind, spec.setup, [*spec.tests, *task.heldout_tests])}
    if reference and spec.tests:
        passed, evaluation = await box.passes(spec, reference, f"{task.task_id}/reference")
        found["reference_passes"] = passed
        found["reference_message"] = evaluation.scored.execution.error_message[:500]
        found.update(judged(evaluation))
        if task.heldout_tests:
            heldout = msgspec.structs.replace(spec, tests=list(task.heldout_tests))
            found["heldout_passes"] = (await box.passes(heldout, reference, f"{task.task_id}/heldout"))[0]
        if passed:
            found.update(await needs_reference(box, task, spec, reference))
            total, run, killed, equivalent, survivors = await check_mutants(
                box, task, spec, limit, config.intake.mutant_timeout_s)
            scored = run - equivalent
            found.update(mutants_total=total, mutants_run=run, mutants_killed=killed, possibly_equivalent=equivalent,
                         survivors=survivors, mutation_score=round(killed / scored, 4) if scored else 1.0)
            found["trivial_run"], found["trivial_passing"] = await check_trivial(
                box, task, spec, config.intake.mutant_timeout_s)
    if task.wrong_solutions and spec.tests:
        wrong = await asyncio.gather(*(box.passes(spec, code, f"{task.task_id}/wrong-{i}")
                                       for i, code in enumerate(task.wrong_solutions)))
        found["wrong_passing"] = [i for i, (passed, _) in enumerate(wrong) if passed]
    check = TaskCheck(task_id=task.task_id, family=task.family, digest=digest(task),
                      wrong_solutions=len(task.wrong_solutions), duplicates=static.duplicates.get(task.task_id, []),
                      contamination=static.contamination.get(task.task_id, []),
                      personal_data=static.personal_data.get(task.task_id, []), **found)
    return msgspec.structs.replace(check, reasons=reasons_of(check, config.intake))


def evaluation_sets(config: Config, tasks: list[TaskSpec]) -> tuple[list[TaskSpec], list[TaskSpec]]:
    """(the held-out split of ``tasks``, the other evaluation tasks: HumanEval and eval.sources)."""
    _, held_out = split_tasks(tasks, config.sampler.holdout_fraction, config.sampler.holdout_seed,
                              near_threshold=config.intake.near_duplicate_threshold)
    others = humaneval_tasks()
    if config.eval.sources:
        others += load_tasks(config.eval.sources)
    return held_out, others


async def run_checks(config: Config, tasks: list[TaskSpec], *, quick: bool = False,
                     backend: SandboxBackend | None = None, advance: Callable[[], None] | None = None
                     ) -> tuple[list[TaskCheck], StaticChecks, dict[str, Any]]:
    """(every task's check, the static findings, figures: seconds, executions, tasks_checked_per_s)."""
    started = time.monotonic()
    held_out, others = evaluation_sets(config, tasks)
    static = static_checks(tasks, others, held_out, config.intake)
    limit = QUICK_MUTANTS if quick else config.intake.max_mutants

    async def all_tasks(pool: SandboxBackend) -> tuple[list[TaskCheck], int]:
        box = Sandbox(pool, config.executor.concurrency)

        async def one(task: TaskSpec) -> TaskCheck:
            check = await check_task(box, task, static, config, limit)
            if advance is not None:
                advance()
            return check
        try:
            return list(await asyncio.gather(*(one(t) for t in tasks))), box.executions
        finally:
            if box.answers is not None:
                box.answers.close()

    if backend is None and all(t.reward.kind == MATH_KIND for t in tasks):
        checks, executions = await all_tasks(NoSandbox())  # answers only: no Docker needed
    elif backend is None:
        async with DockerSandboxPool(config.executor) as pool:
            checks, executions = await all_tasks(pool)
    else:
        checks, executions = await all_tasks(backend)
    seconds = time.monotonic() - started
    figures = {"tasks": len(tasks), "seconds": round(seconds, 2), "executions": executions,
               "tasks_checked_per_s": round(len(tasks) / seconds, 3) if seconds else 0.0,
               "executions_per_s": round(executions / seconds, 1) if seconds else 0.0,
               "mutants_per_task": limit or "all"}
    return checks, static, figures


def family_rows(checks: list[TaskCheck]) -> list[list[Any]]:
    by_family: dict[str, list[TaskCheck]] = defaultdict(list)
    for check in checks:
        by_family[check.family].append(check)
    rows = []
    for family, members in [*sorted(by_family.items()), ("ALL", checks)]:
        scores = [c.mutation_score for c in members if c.mutation_score is not None]
        count = functools.partial(_count, members)
        rows.append([family, len(members), sum(c.passed for c in members),
                     f"{sum(scores) / len(scores):.3f}" if scores else "-", count("weak_tests"),
                     count("reference_fails") + count("reference_fails_heldout"), count("wrong_solution_passes"),
                     sum(bool(c.duplicates) for c in members), count("contaminated"), count("personal_data")])
    return rows


def _count(checks: list[TaskCheck], reason: str) -> int:
    return sum(reason in c.reasons for c in checks)


COLUMNS = ["family", "tasks", "pass", "mutation score", "weak", "reference fails", "wrong passes", "duplicated",
           "contaminated", "personal data"]


def register(name: str, p: argparse.ArgumentParser) -> Any:
    p.add_argument("action", choices=["check", "export"], help="check: run every check and write the intake report; "
                                                                "export: write the TaskSpecs the sources yield (-o)")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="task sources: builtin, jsonl:PATH, humaneval, hf:PATH")
    p.add_argument("-o", "--output", help="export: the JSONL file to write (one TaskSpec a line; '-': stdout)")
    p.add_argument("--quick", action="store_true", help="at most 6 mutants per task (intake.max_mutants otherwise)")
    p.add_argument("--json", dest="json_out", help="write this run's checks (and clusters) as JSON here")
    p.add_argument("--verbose", "-v", action="store_true", help="show every surviving mutant of a weak task")
    return lambda args, config: export_main(args) if args.action == "export" else check_main(config, args)


def export_main(args: argparse.Namespace) -> int:
    """Write the TaskSpecs the sources yield, one a line, in the order the sampler reads them: what
    an adapter made of a dataset's rows, ready for ``jsonl:PATH``. The file is written whole or not at all."""
    if not args.output:
        raise ConfigError("tasks export needs -o FILE (or -o - for standard output)")
    tasks = load_tasks(args.sources)
    lines = b"".join(msgspec.json.encode({k: v for k, v in msgspec.to_builtins(t).items() if v is not None}) + b"\n"
                     for t in tasks)
    if args.output == "-":
        sys.stdout.buffer.write(lines)
        sys.stdout.flush()
    else:
        out = Path(args.output)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_bytes(lines)
        tmp.replace(out)
        families = sorted({t.family for t in tasks})
        print(f"wrote {len(tasks)} tasks ({', '.join(families)}) to {out}", file=sys.stderr)
    return 0


def check_main(config: Config, args: argparse.Namespace) -> int:
    from rollstream.cli.tables import progress, table

    tasks = load_tasks(args.sources)
    with progress("checking tasks", len(tasks)) as advance:
        checks, static, figures = asyncio.run(run_checks(config, tasks, quick=args.quick, advance=advance))
    path = report_path(config)
    save_report(path, checks, static.clusters)
    print(table(COLUMNS, family_rows(checks), right=COLUMNS[1:]))
    failing = [c for c in checks if c.reasons]
    for check in failing:
        print(f"FAIL {check.task_id}: {', '.join(check.reasons)}" + _details(check, args.verbose))
    for check in (c for c in checks if c.needs_reference):
        print(f"NEEDS REFERENCE {check.task_id}: tests {check.needs_reference} cannot be judged without its reference "
              f"(the strict reading fails its own reference there: {check.needs_reference_message[:200]}); keep "
              "reference_solution in its reward spec")
    for check in (c for c in checks if c.in_process_tests):
        print(f"IN PROCESS {check.task_id}: trust = auto runs tests {check.in_process_tests} in the completion's "
              f"process (its reference fails them under the judge), losing {', '.join(check.lost_guarantees)}")
    if static.clusters:
        print(f"{len(static.clusters)} duplicate clusters ({sum(len(c.members) for c in static.clusters)} tasks): "
              + "; ".join(f"{c.kind} {' '.join(c.members)}" for c in static.clusters[:10])
              + (" ..." if len(static.clusters) > 10 else ""))
    print(f"checked {len(checks)} tasks in {figures['seconds']} s ({figures['tasks_checked_per_s']} tasks/s, "
          f"{figures['executions']} sandbox executions); {len(failing)} fail; report: {path}")
    if args.json_out:
        out = {"figures": figures, "tasks": msgspec.to_builtins(checks), "clusters": msgspec.to_builtins(static.clusters)}
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if failing else 0


def _details(check: TaskCheck, verbose: bool) -> str:
    lines = []
    if "reference_fails" in check.reasons:
        lines.append(f"reference: {check.reference_message}")
    if "answer_does_not_parse" in check.reasons:
        lines.append(check.answer_message)
    if "all_skipped" in check.reasons:
        lines.append("every test is skipped by the tests themselves: the task verifies nothing")
    for found in check.params_from_completion:
        lines.append(f"pytest {found}: its parametrize reads the completion's names, so the completion chooses "
                     "its own tests (pass the values in the file itself)")
    for survivor in check.trivial_passing:
        apart = f"; differs from the reference on {survivor.tells_apart}" if survivor.tells_apart else ""
        lines.append(f"a trivial program passes every test: {survivor.name}{apart}")
    if "weak_tests" in check.reasons:
        lines.append(f"mutation score {check.mutation_score} ({check.mutants_killed} of "
                     f"{check.mutants_run - check.possibly_equivalent} killed)")
        shown = [s for s in check.survivors if not s.possibly_equivalent]
        for survivor in shown[: len(shown) if verbose else SURVIVORS_SHOWN]:
            apart = f"; differs on {survivor.tells_apart}" if survivor.tells_apart else ""
            lines.append(f"survivor line {survivor.line} ({survivor.operator}: {survivor.change}){apart}")
    for overlap in check.contamination[:2]:
        lines.append(f"overlaps {overlap.eval_task} ({overlap.field}, {overlap.share:.0%}): {overlap.spans[0][:120]!r}")
    for found in check.personal_data[:3]:
        lines.append(f"{found.kind} in {found.where}: {found.text[:60]!r}")
    return "".join(f"\n    {line}" for line in lines)
