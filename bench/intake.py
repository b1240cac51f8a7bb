"""Task intake: how fast the built-in suite is checked, and what scrubbing costs the executor.

Measures, in one run:

* ``tasks_checked_per_s``: ``rollstream tasks check builtin`` (cli/intake.py: every task's reference,
  held-out tests and wrong solutions, its mutants, survivors told apart on varied inputs, plus the
  duplicate, contamination and personal-data checks) through a warm pool (started before the clock
  starts). ``--quick``: 6 mutants per task (what ``rollstream tasks check --quick`` runs); without it,
  every mutant. Mutants dominate the executions.
* ``scrub_overhead`` = executions/s with the executor's scrubbing (consumers/executor/scrub.py) / without,
  on output that is mostly clean like real runs: every completion prints a few lines (a traceback-like
  line, a list, a status line) to stdout and stderr, and one in 50 also prints an e-mail address.
  Each execution is what the executor does per action: ``evaluate`` through the pool, then (with
  scrubbing) the reward record scrubbed as the stage does it (``Scrubber.outgoing``: a worker
  thread for text the prefilter passes). The two modes alternate in rounds, side by side.

Usage: ``python bench/intake.py --quick --json OUT`` (needs dockerd and the sandbox image). Starts
only containers labelled with its own owner label. The last line printed is the JSON of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollstream.cli.intake import run_checks  # noqa: E402
from rollstream.config import Config, ExecutorConfig  # noqa: E402
from rollstream.consumers.executor.jobs import Job
from rollstream.consumers.executor.pool import DockerSandboxPool  # noqa: E402
from rollstream.consumers.executor.rewards import default_registry  # noqa: E402
from rollstream.consumers.executor.score import evaluate  # noqa: E402
from rollstream.consumers.executor.scrub import Scrubber  # noqa: E402
from rollstream.metrics import StageMetrics  # noqa: E402
from rollstream.schemas.events import RewardSpec  # noqa: E402
from rollstream.tasks.sources import load_tasks  # noqa: E402
from rollstream.testing import make_reward  # noqa: E402

SPEC = RewardSpec(entry_point="add", tests=["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 3) == 5"])
CLEAN = ("import sys\nprint('step 1: loaded 3 items')\nprint([1, 2, 3], {'a': 1})\n"
         "print('warning: value 12 out of range, using 10', file=sys.stderr)\n"
         "def add(a, b):\n    return a + b\n")
LEAKY = CLEAN + "print('contact jane.roe@acme-mail.com', file=sys.stderr)\n"


async def checks_per_s(config: Config, quick: bool) -> dict:
    tasks = load_tasks(["builtin"])
    async with DockerSandboxPool(config.executor) as pool:
        for i in range(20):  # warm-up: containers started, runner forked a few times
            await pool.execute(Job(job_id=f"w{i}", code="def add(a, b):\n    return a + b\n", tests=list(SPEC.tests)))
        checks, _, figures = await run_checks(config, tasks, quick=quick, backend=pool)
    scores = [c.mutation_score for c in checks if c.mutation_score is not None]
    return {**figures, "failing": sum(bool(c.reasons) for c in checks),
            "mean_mutation_score": round(sum(scores) / len(scores), 4)}


async def scrub_rates(config: ExecutorConfig, n: int, rounds: int) -> tuple[float, float, int]:
    """(executions/s with scrubbing, without, placeholders written) over alternating rounds."""
    registry = default_registry()
    scrubber = Scrubber(StageMetrics("executor"))
    Scrubber.warm()
    seconds = {True: 0.0, False: 0.0}
    replaced = 0
    async with DockerSandboxPool(config) as pool:
        gate = asyncio.Semaphore(config.concurrency)

        base = make_reward("g", 0)

        async def one(i: int, scrub: bool) -> int:
            code = LEAKY if i % 50 == 0 else CLEAN
            async with gate:
                evaluation = await evaluate(pool, registry, SPEC, f"```python\n{code}```", f"b{i}")
            record = msgspec.structs.replace(base, execution=evaluation.scored.execution)
            if scrub:  # what the executor stage does to each record before it is produced
                record, _ = await scrubber.outgoing(record, [], SPEC)
            return record.execution.stderr_tail.count("<EMAIL>")

        await asyncio.gather(*(one(i, True) for i in range(50)))  # warm-up
        for _ in range(rounds):
            for scrub in (False, True):
                started = time.perf_counter()
                replaced += sum(await asyncio.gather(*(one(i, scrub) for i in range(n))))
                seconds[scrub] += time.perf_counter() - started
    total = n * rounds
    return total / seconds[True], total / seconds[False], replaced


async def scrub_microseconds(config: ExecutorConfig) -> tuple[float, float]:
    """(µs the scrubbing of one record costs on the clean output, on the leaky one), in process."""
    registry = default_registry()
    scrubber = Scrubber(StageMetrics("executor"))
    base = make_reward("g", 0)
    async with DockerSandboxPool(msgspec.structs.replace(config, pool_size=1)) as pool:
        records = []
        for code in (CLEAN, LEAKY):
            evaluation = await evaluate(pool, registry, SPEC, f"```python\n{code}```", "m")
            records.append(msgspec.structs.replace(base, execution=evaluation.scored.execution))
    costs = []
    for record, n in zip(records, (5000, 500)):
        started = time.perf_counter()
        for _ in range(n):
            scrubber.reward(record, SPEC)
        costs.append((time.perf_counter() - started) / n * 1e6)
    return costs[0], costs[1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 mutants per task, fewer scrub rounds")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--image", default="rollstream-sandbox:latest")
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    executor = ExecutorConfig(image=args.image, owner=owner, pool_size=args.pool_size, concurrency=args.concurrency,
                              recycle_after=1_000_000)
    load_before = os.getloadavg()[0]
    check = await checks_per_s(Config(executor=executor), args.quick)
    with_scrub, without, replaced = await scrub_rates(executor, 200 if args.quick else 500, 6 if args.quick else 10)
    clean_us, leaky_us = await scrub_microseconds(executor)
    figures = {
        "tasks_checked_per_s": check["tasks_checked_per_s"],
        "scrub_overhead": round(with_scrub / without, 3),
        "tasks": check["tasks"], "check_seconds": check["seconds"], "check_executions": check["executions"],
        "check_executions_per_s": check["executions_per_s"], "mutants_per_task": check["mutants_per_task"],
        "failing_tasks": check["failing"], "mean_mutation_score": check["mean_mutation_score"],
        "executions_per_s_scrubbed": round(with_scrub, 1), "executions_per_s_unscrubbed": round(without, 1),
        "placeholders_written": replaced, "scrub_us_clean_record": round(clean_us, 1),
        "scrub_us_leaky_record": round(leaky_us, 1), "pool_size": args.pool_size, "concurrency": args.concurrency,
        "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2),
    }
    print(f"checked {check['tasks']} tasks in {check['seconds']} s: {check['tasks_checked_per_s']} tasks/s "
          f"({check['executions']} executions, {check['failing']} failing)")
    print(f"executor with scrubbing {with_scrub:.1f}/s, without {without:.1f}/s: overhead ratio "
          f"{with_scrub / without:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
