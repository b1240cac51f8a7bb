"""The built-in polyglot suite (source ``suite:polyglot``): up to date, well formed, ten tasks or more in
each of six languages with a family per language, every task with a right and a wrong program (unit);
and, where the polyglot image has been built, every right program passes and every wrong one does not,
each built and judged through a real pool keyed by its language (sandbox).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.pool import DockerSandboxPool
from rollstream.consumers.executor.rewards import RUNNABLE_LANGUAGES, default_registry
from rollstream.consumers.executor.score import evaluate
from rollstream.errors import ConfigError
from rollstream.tasks.polyglot import build
from rollstream.tasks.sources import (
    POLYGLOT_SUITE_DIR,
    builtin_tasks,
    load_tasks,
    math_suite_tasks,
    polyglot_suite_tasks,
    split_tasks,
    suite_tasks,
)
from tests.consumers.executor.test_language_image import polyglot_image

LANGUAGES = {"c", "cpp", "java", "javascript", "go", "rust"}
FENCE = {"c": "c", "cpp": "cpp", "java": "java", "javascript": "javascript", "go": "go", "rust": "rust"}


@pytest.mark.unit
def test_polyglot_suite_files_are_up_to_date() -> None:
    files = build.render()
    assert sorted(files) == sorted(p.name for p in POLYGLOT_SUITE_DIR.glob("*.jsonl"))
    assert sorted(files) == sorted(f"{language}.jsonl" for language in LANGUAGES)
    for name, content in files.items():
        assert (POLYGLOT_SUITE_DIR / name).read_bytes() == content, \
            f"{name} is stale: run python -m rollstream.tasks.polyglot.build"
    assert build.render() == files  # the same on every build
    assert build.main(["--check"]) == 0


@pytest.mark.unit
def test_polyglot_suite_size_languages_families_and_solutions() -> None:
    tasks = polyglot_suite_tasks()
    languages = Counter(t.reward.language for t in tasks)
    assert len(tasks) >= 60 and set(languages) == LANGUAGES and min(languages.values()) >= 10, languages
    assert LANGUAGES <= RUNNABLE_LANGUAGES
    assert len({t.task_id for t in tasks}) == len(tasks)
    assert len({t.prompt for t in tasks}) == len(tasks)
    for task in tasks:
        language, spec = task.reward.language, task.reward
        assert task.task_id.startswith(f"polyglot/{language}/"), task.task_id
        family_language, _, family = task.family.partition("/")
        assert family_language == language and family, task.family
        assert spec.kind == "python_tests" and spec.program and spec.timeout_s >= 10.0
        assert 3 <= len(spec.tests) <= 6 and all(t.startswith("assert run_program(") for t in spec.tests)
        assert f"```{FENCE[language]} code block" in task.prompt and "standard input" in task.prompt
        assert task.reference_solution.startswith(f"```{FENCE[language]}\n")
        assert task.reference_solution.endswith("\n```")
        assert len(task.wrong_solutions) == 1 and task.wrong_solutions[0] != task.reference_solution
        assert task.wrong_solutions[0].startswith(f"```{FENCE[language]}\n")
    # every problem in every language, over the code suite's kinds of family
    problems = Counter(t.task_id.rsplit("/", 1)[1] for t in tasks)
    assert set(problems.values()) == {len(LANGUAGES)}, problems
    families = {t.family.partition("/")[2] for t in tasks}
    assert len(families) >= 8 and families <= {t.family for t in builtin_tasks()}, families
    assert not {t.family for t in tasks} & {t.family for t in builtin_tasks() + math_suite_tasks()}


@pytest.mark.unit
def test_each_problem_s_tests_follow_its_solver_and_cover_an_edge_case() -> None:
    for problem in build.PROBLEMS:
        tests = build.tests(problem)
        assert len(tests) == len(problem.inputs) >= 4
        for stdin, test in zip(problem.inputs, tests):
            expected = eval(re.fullmatch(r"assert run_program\(.*\)\.split\(\) == (.*)", test, re.S)[1])
            assert expected == problem.solve(stdin).split()
        for language in build.LANGUAGES:  # each wrong program is its right one with one edit
            code, old, new = build.PROGRAMS[problem.name][language]
            assert code.count(old) == 1 and old != new, (problem.name, language)


@pytest.mark.unit
def test_suite_polyglot_loads_and_splits_per_language() -> None:
    tasks = load_tasks(["suite:polyglot"])
    assert tasks == sorted(suite_tasks("polyglot"), key=lambda t: t.task_id)
    both = load_tasks(["builtin", "suite:polyglot"])
    assert len(both) == len(builtin_tasks()) + len(tasks)
    with pytest.raises(ConfigError, match="suite:code, suite:math, suite:polyglot"):
        load_tasks(["suite:nope"])
    trained, held = split_tasks(tasks, 0.2, seed=0)
    assert len(trained) + len(held) == len(tasks)
    assert {t.reward.language for t in held} == LANGUAGES


# ---------------------------------------------------------------- in the language image


@pytest.fixture
async def language_pool(sandbox_image: str, owner: str):
    config = ExecutorConfig(image=sandbox_image, language_image=polyglot_image(), owner=owner, pool_size=1,
                            keyed_pool_size=2, concurrency=2, compile_timeout_s=60.0)
    async with DockerSandboxPool(config, grace_s=3.0) as pool:
        yield pool


@pytest.mark.sandbox
@pytest.mark.parametrize("language", sorted(LANGUAGES))
async def test_every_right_program_passes_and_every_wrong_one_does_not(language_pool, language: str) -> None:
    registry = default_registry(entry_points=[])
    tasks = [t for t in polyglot_suite_tasks() if t.reward.language == language]
    assert len(tasks) >= 10
    jobs = [(t, "reference", t.reference_solution) for t in tasks]
    jobs += [(t, "wrong", t.wrong_solutions[0]) for t in tasks]
    gate = asyncio.Semaphore(2)  # two builds at a time: the machine may have two cores

    async def judge(index: int, task, completion: str):
        async with gate:
            evaluation = await evaluate(language_pool, registry, task.reward, f"Here:\n{completion}\n",
                                        f"polyglot-{language}-{index}", task_id=task.task_id)
            return evaluation.scored

    scored = await asyncio.gather(*(judge(i, t, text) for i, (t, _, text) in enumerate(jobs)))
    bad = []
    for (task, what, _), result in zip(jobs, scored):
        execution = result.execution
        if what == "reference":
            ok = execution.outcome == "passed" and result.reward == 1.0
        else:  # builds and runs, and fails a test
            ok = execution.outcome != "passed" and result.reward < 1.0 and execution.error_kind != "infra"
        if not ok:
            bad.append((task.task_id, what, execution.outcome, result.reward,
                        (execution.error_message or execution.stderr_tail or "")[-300:]))
    assert not bad, bad
    assert len(scored) == 2 * len(tasks)
