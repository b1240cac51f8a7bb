"""`rollstream eval`: the pass@k math, the summary, and one tiny end-to-end run."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from rollstream.cli.evaluate import format_table, run
from rollstream.config import Config, EvalConfig, ExecutorConfig, GeneratorConfig
from rollstream.evaluator.play import SampleResult
from rollstream.evaluator.report import pass_at_k, summarize
from rollstream.testing import make_tiny_model_dir


@pytest.mark.unit
def test_pass_at_k() -> None:
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(1, 0, 2)


@pytest.mark.unit
def test_summarize_per_family() -> None:
    results = [SampleResult("a/1", "a", i, i == 0, 1.0 if i == 0 else 0.0, "none", "stop", 5) for i in range(2)]
    results += [SampleResult("b/1", "b", i, False, -0.5, "syntax", "length", 9) for i in range(2)]
    summary = summarize(results, (1, 2))
    assert summary["a"]["pass@1"] == 0.5 and summary["a"]["pass@2"] == 1.0
    assert summary["b"]["pass@1"] == 0.0 and summary["ALL"]["tasks"] == 2
    assert summary["ALL"]["pass@1"] == 0.25 and summary["ALL"]["tasks_solved"] == 1
    table = format_table(summary, (1, 2))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    assert rows[0][:4] == ["family", "tasks", "samples", "pass@1"] and set(rows[1][0]) == {"-"}
    assert ["a", "1", "2", "0.500", "1.000", "1/1"] in [row[:6] for row in rows] and rows[-1][0] == "ALL"


@pytest.mark.sandbox
async def test_eval_end_to_end_with_a_tiny_model(tmp_path: Path, sandbox_image: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny")
    out = tmp_path / "report.json"
    completions = tmp_path / "completions.jsonl"
    config = Config(generator=GeneratorConfig(model=str(model), max_new_tokens=8),
                    executor=ExecutorConfig(pool_size=1, concurrency=2, owner="rollstream-test-eval"),
                    eval=EvalConfig(sources=["builtin"], families=["math", "bits"], limit_per_family=2, samples=2,
                                    ks=[1, 2], batch=4, json_out=str(out), completions_out=str(completions)))
    report = await run(config)
    assert set(report["families"]) == {"math", "bits", "ALL"}
    assert report["families"]["ALL"]["samples"] == 8 and report["families"]["ALL"]["tasks"] == 4
    assert json.loads(out.read_text())["families"]["math"]["tasks"] == 2
    lines = [json.loads(line) for line in completions.read_text().splitlines()]
    assert len(lines) == 8 and all(not line["passed"] for line in lines)  # a random model solves nothing
    assert msgspec.json.decode(out.read_bytes())["sampling"]["max_new_tokens"] == 8


@pytest.mark.sandbox
async def test_eval_with_two_turns_reports_pass_after_each_turn_from_one_run(tmp_path: Path, sandbox_image: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny", max_positions=2048)
    completions = tmp_path / "completions.jsonl"
    config = Config(generator=GeneratorConfig(model=str(model), max_new_tokens=8),
                    executor=ExecutorConfig(pool_size=1, concurrency=2, owner="rollstream-test-eval"),
                    eval=EvalConfig(sources=["builtin"], families=["math"], limit_per_family=2, samples=2, turns=2,
                                    batch=4, completions_out=str(completions)))
    report = await run(config)
    by_turns = report["families_by_turns"]
    assert set(by_turns) == {"1", "2"} and report["turns"] == 2
    assert by_turns["1"]["ALL"]["samples"] == by_turns["2"]["ALL"]["samples"] == 4
    assert by_turns["2"]["ALL"]["passed"] >= by_turns["1"]["ALL"]["passed"]
    lines = [json.loads(line) for line in completions.read_text().splitlines()]
    # a random model fails: every sample had a second turn, sampled from its transcript and the observation
    assert [line["turns"] for line in lines] == [2] * 4 and not any(line["passed"] for line in lines)


@pytest.mark.sandbox
async def test_eval_resume_generates_only_missing_samples(tmp_path: Path, sandbox_image: str) -> None:
    model = make_tiny_model_dir(tmp_path / "tiny")
    completions = tmp_path / "completions.jsonl"
    first = EvalConfig(sources=["builtin"], task_ids=["math/add"], batch=4, completions_out=str(completions))
    config = Config(generator=GeneratorConfig(model=str(model), max_new_tokens=4),
                    executor=ExecutorConfig(pool_size=1, concurrency=2, owner="rollstream-test-eval"), eval=first)
    await run(config)
    assert len(completions.read_text().splitlines()) == 1

    def with_eval(**changes: object) -> Config:
        return msgspec.structs.replace(config, eval=msgspec.structs.replace(first, **changes))

    nothing_new = await run(with_eval(resume=True))
    assert nothing_new["generated_tokens"] == 0 and nothing_new["families"]["ALL"]["samples"] == 1
    more = await run(with_eval(resume=True, task_ids=["math/add", "math/square"]))
    assert more["families"]["ALL"]["samples"] == 2 and more["generated_tokens"] > 0
    rows = [json.loads(line) for line in completions.read_text().splitlines()]
    assert sorted(r["task_id"] for r in rows) == ["math/add", "math/square"]


@pytest.mark.unit
def test_the_flags_set_keys_of_the_eval_section() -> None:
    import argparse

    from rollstream.cli.evaluate import add_arguments, eval_overrides
    from rollstream.config_load import load_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--samples", "4", "--k", "1,4", "--family", "math", "--family", "bits", "--resume",
                              "--completions", "c.jsonl", "--task", "math/add"])
    config = load_config(None, ["eval.batch=3", *eval_overrides(args)], environ={})
    assert config.eval.ks == [1, 4] and config.eval.families == ["math", "bits"] and config.eval.resume
    assert config.eval.task_ids == ["math/add"] and config.eval.samples == 4 and config.eval.batch == 3
    assert eval_overrides(parser.parse_args([])) == []  # unset flags leave the config's values
    from rollstream.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.samples >= 4"):
        load_config(None, eval_overrides(parser.parse_args(["--k", "4"])), environ={})


@pytest.mark.unit
def test_bootstrap_difference_over_tasks() -> None:
    from rollstream.cli.evaluate import bootstrap_difference

    before = {f"t{i}": 0.0 for i in range(40)}
    better = {f"t{i}": (0.5 if i % 2 else 0.25) for i in range(40)}
    up = bootstrap_difference(before, better, resamples=2000)
    assert up["difference"] == pytest.approx(0.375) and 0.3 < up["ci_low"] < 0.375 < up["ci_high"] < 0.45
    noise = {f"t{i}": (0.5 if i % 2 else -0.5) + 0.0 for i in range(40)}  # as much up as down
    flat = bootstrap_difference({t: 0.5 for t in noise}, {t: 0.5 + v for t, v in noise.items()}, resamples=2000)
    assert flat["ci_low"] < 0 < flat["ci_high"]  # no difference: the interval holds zero
    with pytest.raises(ValueError):
        bootstrap_difference({"a": 1.0}, {"b": 1.0})


@pytest.mark.unit
def test_compare_reads_gzipped_completions_and_pairs_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gzip

    from rollstream.cli.evaluate import compare_main, per_task_pass

    def rows(passes: dict[str, list[bool]]) -> bytes:
        return b"".join(json.dumps({"task_id": t, "family": t.split("/")[0], "passed": p}).encode() + b"\n"
                        for t, ps in passes.items() for p in ps)

    before = {"a/1": [False, False], "a/2": [True, False], "b/1": [False, False], "b/2": [False, True]}
    after = {"a/1": [True, True], "a/2": [True, False], "b/1": [False, True], "b/2": [True, True]}
    (tmp_path / "before.jsonl").write_bytes(rows(before))
    (tmp_path / "after.jsonl.gz").write_bytes(gzip.compress(rows(after)))
    assert per_task_pass(tmp_path / "after.jsonl.gz") == {"a/1": ("a", 1.0), "a/2": ("a", 0.5), "b/1": ("b", 0.5),
                                                          "b/2": ("b", 1.0)}
    assert compare_main(str(tmp_path / "before.jsonl"), str(tmp_path / "after.jsonl.gz"), str(tmp_path / "c.json")) == 0
    figures = json.loads((tmp_path / "c.json").read_text())
    assert figures["before"] == 0.25 and figures["after"] == 0.75 and figures["difference"] == 0.5
    assert 0 < figures["ci_low"] <= 0.5 <= figures["ci_high"] <= 1.0  # every task gained: the interval is above 0
    table = {cells[0]: cells[1:] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")
             for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert table["a"] == ["2", "0.250", "0.750"] and table["b"] == ["2", "0.250", "0.750"]
