"""The built-in suite: well-formed, up to date, and every task separates right from wrong.

Through the real sandbox (``rollstream-sandbox:latest``, Docker): each task's reference
solution scores 1.0 on its visible tests and on its held-out tests, and its wrong solution
scores below 1.0 on the visible tests (the reward the learner sees).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import msgspec
import pytest

from rollstream.config import ExecutorConfig
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.sources import SUITE_DIR, builtin_tasks, wrong_solutions
from rollstream.tasks.suite import build_suite


def fenced(code: str) -> str:
    return f"Here is the function:\n\n```python\n{code}```\n"


def plain_tasks() -> list[TaskSpec]:
    """The suite's one-function tasks (the subtask chains are checked on their own below)."""
    return [t for t in builtin_tasks() if not t.reward.subtasks]


@pytest.mark.unit
def test_suite_size_and_families() -> None:
    tasks = plain_tasks()
    families = Counter(t.family for t in tasks)
    assert len(tasks) >= 200 and len(families) >= 10, families
    assert min(families.values()) >= 15
    for task in tasks:
        assert task.reward.tests and task.heldout_tests and task.reference_solution
        assert "```python" in task.prompt and set(task.heldout_tests).isdisjoint(task.reward.tests)
        if task.reward.program:  # a whole program: the tests run it on a standard input
            assert not task.reward.entry_point
            assert all("run_program(" in t for t in task.reward.tests + task.heldout_tests)
        else:
            assert all(f"{task.reward.entry_point}(" in t for t in task.reward.tests + task.heldout_tests)
            assert f"`{task.reward.entry_point}(" in task.prompt
    assert set(wrong_solutions()) == {t.task_id for t in tasks}
    assert Counter(t.difficulty == 0 for t in tasks)[True] >= 5 * len(families)  # easy tasks in every family


@pytest.mark.unit
def test_every_judged_kind_has_five_tasks() -> None:
    """Classes, printed output, programs, in-place mutation, expected exceptions: each kind the
    judge supports beyond plain function asserts is in the suite at least five times."""
    from rollstream.tasks.suite.judged_kinds import JUDGED, KINDS

    ids = {t.task_id for t in plain_tasks()}
    kinds = Counter(j.kind for j in JUDGED if f"{j.family}/{j.name}" in ids)
    assert set(kinds) == set(KINDS) and min(kinds.values()) >= 5, kinds


@pytest.mark.unit
def test_suite_files_are_up_to_date() -> None:
    """The JSONL files are exactly what build_suite.py makes (which also runs every reference
    and wrong solution in-process)."""
    files = build_suite.render(build_suite.all_defs())
    for name, content in files.items():
        assert (SUITE_DIR / name).read_bytes() == content, f"{name} is stale: run python -m rollstream.tasks.suite.build_suite"


async def _score_all(tasks: list[TaskSpec], wrong: dict[str, str]) -> list[tuple[str, str, float, object]]:
    from rollstream.consumers.executor.pool import DockerSandboxPool
    from rollstream.consumers.executor.reference import ReferenceChecks
    from rollstream.consumers.executor.rewards import default_registry
    from rollstream.consumers.executor.score import evaluate

    registry = default_registry()
    config = ExecutorConfig(pool_size=2, concurrency=4, owner="rollstream-test-suite")
    jobs = []
    for t in tasks:
        spec = t.issued_reward()  # with its reference: checked once, its plain calls then enforced
        heldout = msgspec.structs.replace(spec, tests=list(t.heldout_tests))
        jobs += [(t.task_id, "reference", spec, fenced(t.reference_solution or "")),
                 (t.task_id, "reference-heldout", heldout, fenced(t.reference_solution or "")),
                 (t.task_id, "wrong", spec, fenced(wrong[t.task_id]))]
    gate = asyncio.Semaphore(config.concurrency)
    async with DockerSandboxPool(config) as pool:
        references = ReferenceChecks(pool)

        async def one(job: tuple) -> tuple[str, str, float, object]:
            task_id, what, spec, completion = job
            async with gate:
                ev = await evaluate(pool, registry, spec, completion, f"suite-{task_id}-{what}", references=references)
            assert ev.reference is not None and ev.reference.judged, (task_id, ev.reference)
            return task_id, what, ev.scored.reward, ev.scored.execution
        return await asyncio.gather(*(one(j) for j in jobs))


@pytest.mark.sandbox
async def test_every_task_through_the_real_sandbox(sandbox_image: str) -> None:
    tasks = plain_tasks()
    results = await _score_all(tasks, wrong_solutions())
    bad = []
    for task_id, what, reward, execution in results:
        ok = reward < 1.0 if what == "wrong" else reward == 1.0
        if what != "wrong":
            assert execution.sandbox_id and execution.tests_total > 0  # it really ran in a sandbox
        if not ok:
            bad.append((task_id, what, reward, getattr(execution, "error_kind", None),
                        getattr(execution, "error_message", "")[:200]))
    assert not bad, bad
    assert len(results) == 3 * len(tasks)
    wrong_rewards = [reward for _, what, reward, _ in results if what == "wrong"]
    print(f"wrong solutions: mean reward {sum(wrong_rewards) / len(wrong_rewards):.3f}, "
          f"{sum(r > 0 for r in wrong_rewards)} of {len(wrong_rewards)} partly right")


@pytest.mark.unit
def test_chains_are_up_to_date_and_well_formed() -> None:
    from rollstream.tasks.suite import chains

    assert (SUITE_DIR / "chains.jsonl").read_bytes() == chains.render(), "run python -m rollstream.tasks.suite.chains"
    tasks = [t for t in builtin_tasks() if t.reward.subtasks]
    assert len(tasks) >= 20 and {t.family for t in tasks} == {"chains"}
    for task in tasks:
        steps = task.reward.subtasks
        assert len(steps) >= 2 and all(s.tests and s.reference for s in steps)
        assert task.max_turns == len(steps) + 2 and task.reward.tests == [t for s in steps for t in s.tests]
        assert "Step 1 of" in task.prompt and steps[0].instruction in task.prompt


@pytest.mark.sandbox
async def test_every_chain_step_through_the_real_sandbox_with_the_code_carried(sandbox_image: str) -> None:
    """Each step's reference, run after the code of the steps before it (as an episode carries it),
    passes its step's tests in the sandbox; without the code carried, the last step fails (it uses
    what the earlier ones defined)."""
    from rollstream.consumers.executor.episodes import subtask_turn
    from rollstream.consumers.executor.pool import DockerSandboxPool
    from rollstream.consumers.executor.reference import ReferenceChecks
    from rollstream.consumers.executor.rewards import default_registry
    from rollstream.consumers.executor.score import evaluate
    from rollstream.testing import make_action

    registry = default_registry()
    jobs = []
    for task in (t for t in builtin_tasks() if t.reward.subtasks):
        carried = ""
        for step, subtask in enumerate(task.reward.subtasks):
            last = step == len(task.reward.subtasks) - 1
            for with_carried in ((True, False) if last else (True,)):
                action = msgspec.structs.replace(make_action(task.task_id, step), reward=task.reward,
                                                 completion_text=fenced(subtask.reference or ""),
                                                 subtask_index=step, carried_code=carried if with_carried else "")
                jobs.append((task.task_id, step, with_carried, *subtask_turn(action)))
            carried = f"{carried}\n\n{subtask.reference}" if carried else subtask.reference or ""
    config = ExecutorConfig(pool_size=2, concurrency=4, owner="rollstream-test-chains")
    gate = asyncio.Semaphore(config.concurrency)
    async with DockerSandboxPool(config) as pool:
        references = ReferenceChecks(pool)  # as the executor stage checks each step's (stage.py)

        async def one(job: tuple) -> tuple:
            task_id, step, with_carried, spec, completion = job
            async with gate:
                ev = await evaluate(pool, registry, spec, completion, f"chain-{task_id}-{step}-{with_carried}",
                                    references=references)
                assert ev.reference is not None and ev.reference.judged, (task_id, step, ev.reference)
            return task_id, step, with_carried, ev.scored.execution.passed
        results = await asyncio.gather(*(one(j) for j in jobs))
    wrong = [(t, s, c) for t, s, c, passed in results if passed != c]
    assert not wrong, wrong  # passes with the code carried, fails without it


@pytest.mark.sandbox
async def test_the_suite_passes_its_own_intake(sandbox_image: str, owner: str) -> None:
    """`rollstream tasks check builtin --quick`: every reference passes its visible and held-out
    tests, every wrong solution fails, every task's tests kill at least intake.min_mutation_score of
    its mutants (6 per task), and nothing is contaminated or personal."""
    from rollstream.cli.intake import run_checks
    from rollstream.config import Config

    config = Config(executor=ExecutorConfig(image=sandbox_image, owner=owner, pool_size=2, concurrency=4))
    checks, static, figures = await run_checks(config, builtin_tasks(), quick=True)
    failing = {c.task_id: (c.reasons, [(s.change, s.tells_apart) for s in c.survivors]) for c in checks if c.reasons}
    assert failing == {}
    assert all(c.mutants_run > 0 and c.reference_passes for c in checks)
    assert len(static.clusters) >= 10  # reported, held out together (tests/rollstream/tasks/test_sources.py)
    print(figures)
