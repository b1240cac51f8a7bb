"""``rollstream tasks check`` through the real sandbox: weak tests are flagged with the mutant that
survives them (and the input that would kill it), a wrong solution that passes and a reference
that fails are reasons, a possibly-equivalent survivor is left out of the score, and the report
the sampler reads is written by task digest."""

from __future__ import annotations

import argparse
import ast
import asyncio
import json

import msgspec
import pytest

from rollstream.cli.intake import check_main, run_checks
from rollstream.config import Config, ExecutorConfig, InfraConfig, IntakeConfig
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.intake import apply_intake, digest, load_report

pytestmark = pytest.mark.sandbox

MAX2 = "def max2(a, b):\n    if a >= b:\n        return a\n    return b\n"


def task(task_id: str, reference: str, tests: list[str], wrong: list[str] = (), heldout: list[str] = ()) -> TaskSpec:
    name = ast.parse(reference).body[0].name  # type: ignore[attr-defined]
    return TaskSpec(task_id=task_id, family="t", prompt=f"Write `{name}`.", reference_solution=reference,
                    reward=RewardSpec(entry_point=name, tests=tests), heldout_tests=list(heldout),
                    wrong_solutions=list(wrong))


def config_for(executor_config: ExecutorConfig, tmp_path) -> Config:
    return Config(infra=InfraConfig(state_dir=str(tmp_path)),
                  executor=msgspec.structs.replace(executor_config, pool_size=2, concurrency=4),
                  intake=IntakeConfig(mutant_timeout_s=1.0))


async def test_weak_tests_are_flagged_with_the_mutant_that_survives_them(executor_config, tmp_path) -> None:
    tasks = [
        # two tests far from the boundary cannot tell `age >= 18` from `age > 18`
        task("t/is_adult", "def is_adult(age):\n    return age >= 18\n", ["assert is_adult(19)", "assert not is_adult(5)"],
             wrong=["def is_adult(age):\n    return age > 20\n"]),
        task("t/strong_max2", MAX2, ["assert max2(3, 1) == 3", "assert max2(1, 3) == 3", "assert max2(2, 2) == 2"],
             wrong=["def max2(a, b):\n    return a\n"], heldout=["assert max2(-1, -2) == -1"]),
        # a wrong solution that passes and a reference that fails its held-out test
        task("t/inc", "def inc(n):\n    return n + 1\n", ["assert inc(1) == 2", "assert inc(-1) == 0"],
             wrong=["def inc(n):\n    return n + 1 if n < 100 else n\n"], heldout=["assert inc(5) == 7"]),
        # where the branch is taken does not matter (at 0 or -1 both give the same): such survivors are
        # possibly equivalent and left out of the score
        task("t/square", "def square(n):\n    return n * n if n >= 0 else (-n) * (-n)\n",
             ["assert square(3) == 9", "assert square(-2) == 4"]),
    ]
    checks, static, figures = await run_checks(config_for(executor_config, tmp_path), tasks)
    by_id = {c.task_id: c for c in checks}

    weak = by_id["t/is_adult"]
    assert weak.reasons == ["weak_tests"] and weak.reference_passes and weak.wrong_passing == []
    assert weak.mutation_score is not None and weak.mutation_score < 0.7
    boundary = next(s for s in weak.survivors if s.change == ">= -> >")
    assert not boundary.possibly_equivalent and "age > 18" in boundary.source
    assert boundary.tells_apart == "is_adult(18)"  # the test to add

    strong = by_id["t/strong_max2"]  # `a >= b` -> `a > b` survives, but returns the same: left out
    assert strong.reasons == [] and strong.mutation_score == 1.0 and strong.heldout_passes
    assert [s.change for s in strong.survivors] == [">= -> >"] and strong.survivors[0].possibly_equivalent

    inc = by_id["t/inc"]
    assert inc.reasons == ["reference_fails_heldout", "wrong_solution_passes"] and inc.wrong_passing == [0]

    square = by_id["t/square"]
    assert square.possibly_equivalent >= 1 and all(s.possibly_equivalent for s in square.survivors)
    assert square.mutation_score == 1.0 and square.reasons == []
    assert figures["tasks"] == 4 and figures["executions"] > 20


async def test_the_report_is_written_by_digest_and_read_by_the_sampler(executor_config, tmp_path) -> None:
    tasks = [task("t/max2", MAX2, ["assert max2(3, 1) == 3"]),
             task("t/strong_max2", MAX2, ["assert max2(3, 1) == 3", "assert max2(1, 3) == 3",
                                          "assert max2(2, 2) == 2"])]
    source = tmp_path / "tasks.jsonl"
    source.write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in tasks))
    config = config_for(executor_config, tmp_path)
    args = argparse.Namespace(sources=[f"jsonl:{source}"], quick=True, json_out=str(tmp_path / "out.json"),
                              verbose=False)
    status = await asyncio.to_thread(check_main, config, args)
    assert status == 1  # one task fails
    report = load_report(tmp_path / "intake.json")
    assert report is not None and set(report.tasks) == {digest(t) for t in tasks}
    out = json.loads((tmp_path / "out.json").read_text())
    assert {t["task_id"]: t["reasons"] for t in out["tasks"]} == {"t/max2": ["weak_tests"], "t/strong_max2": []}
    kept, quarantined = apply_intake(tasks, report, IntakeConfig(mode="enforce"))
    assert [t.task_id for t in kept] == ["t/strong_max2"] and quarantined[0].reasons == ["weak_tests"]


async def test_a_task_of_skips_fails_and_one_the_judge_cannot_honour_says_what_it_loses(executor_config,
                                                                                        tmp_path) -> None:
    """Every test skipped by the tests themselves is a reason (the task verifies nothing); a task whose
    reference passes a test only in process runs it there under trust = "auto" (mixed), and its check
    lists that test and the guarantees it loses."""
    skips = task("t/skips", MAX2, ["import unittest\nclass T(unittest.TestCase):\n    @unittest.skip('later')\n"
                                   "    def test_a(self):\n        self.assertEqual(max2(1, 2), 2)\nunittest.main()"])
    mixed = task("t/mixed", MAX2, ["import inspect\nassert inspect.isfunction(max2)", "assert max2(3, 1) == 3",
                                   "assert max2(1, 3) == 3", "assert max2(2, 2) == 2"])
    mixed = msgspec.structs.replace(mixed, reward=msgspec.structs.replace(mixed.reward, trust="auto"))
    checks, _, _ = await run_checks(config_for(executor_config, tmp_path), [skips, mixed], quick=True)
    by_id = {c.task_id: c for c in checks}
    assert "all_skipped" in by_id["t/skips"].reasons and by_id["t/skips"].all_skipped
    found = by_id["t/mixed"]
    assert found.reference_passes and found.in_process_tests == [0] and not found.all_skipped, found
    assert "separate_process" in found.lost_guarantees and "all_skipped" not in found.reasons


async def test_tests_a_trivial_program_passes_are_weak_whatever_the_mutation_score(executor_config, tmp_path) -> None:
    """The planted tasks of issue 36: a one-line reference whose few mutants all die, and tests
    that "return the last argument" or "return a constant of the tests" pass."""
    tasks = [
        task("t/larger", "def larger(a, b):\n    return max(a, b)\n", ["assert larger(1, 2) == 2", "assert larger(3, 5) == 5"]),
        task("t/vowels", "def vowels(s):\n    return sum(c in 'aeiou' for c in s)\n",
             ["assert vowels('hello') == 2", "assert vowels('moon') == 2"]),
        # not plain comparisons: run in the sandbox
        task("t/larger_run", "def larger_run(a, b):\n    return max(a, b)\n",
             ["r = larger_run(1, 2)\nassert r == 2", "r = larger_run(3, 5)\nassert r == 5"]),
        task("t/strong_max2", MAX2, ["assert max2(3, 1) == 3", "assert max2(1, 3) == 3", "assert max2(2, 2) == 2"]),
        # the task is that trivial: the identity agrees with the reference everywhere
        task("t/same", "def same(x):\n    return x\n", ["assert same(3) == 3", "assert same('a') == 'a'"]),
    ]
    checks, _, figures = await run_checks(config_for(executor_config, tmp_path), tasks)
    by_id = {c.task_id: c for c in checks}
    larger = by_id["t/larger"]
    assert larger.reasons == ["weak_tests"] and [s.name for s in larger.trivial_passing] == ["return argument 1"]
    assert larger.trivial_passing[0].tells_apart.startswith("larger(")  # an input where max(a, b) != b
    assert by_id["t/vowels"].reasons == ["weak_tests"]
    assert [s.name for s in by_id["t/vowels"].trivial_passing] == ["return 2"]
    run = by_id["t/larger_run"]
    assert run.reasons == ["weak_tests"] and [s.name for s in run.trivial_passing] == ["return argument 1"]
    assert by_id["t/strong_max2"].reasons == [] and by_id["t/strong_max2"].trivial_run > 3
    assert by_id["t/same"].reasons == [] and by_id["t/same"].trivial_passing == []


async def test_every_published_layout_s_fixture_checks_through_the_judge(executor_config, tmp_path) -> None:
    """Issue 40: the rows of each adapter's fixture (rollstream/tasks/layouts.py) become tasks whose
    shipped references pass their tests through the judge (stdin programs, calls, Solution classes,
    pytest functions); rows that ship none are reported as such and nothing else."""
    from pathlib import Path

    from rollstream.tasks.sources import load_tasks

    fixtures = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "layouts").glob("*.jsonl"))
    # the code layouts: the math ones (a gold answer, no sandbox, two rows broken on purpose) are
    # checked by tests/rollstream/tasks/test_math_layouts.py
    tasks = [t for t in load_tasks([f"hf:{f}" for f in fixtures]) if t.reward.kind != "math_answer"]
    assert {t.family for t in tasks} >= {"taco", "livecodebench", "open_r1", "open_r1_python", "acecode", "kodcode"}
    checks, _, _ = await run_checks(config_for(executor_config, tmp_path), tasks, quick=True)
    with_reference = {t.task_id for t in tasks if t.reference_solution}
    assert len(with_reference) >= 9
    failing = {c.task_id: c.reasons for c in checks if c.reasons != ([] if c.task_id in with_reference else ["no_reference"])}
    assert failing == {}
