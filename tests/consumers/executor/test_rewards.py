"""Pure reward logic: extraction, syntax-error parsing, components, verdicts, the registry."""

from __future__ import annotations

import pytest

from rollstream.consumers.executor import rewards as rewards_module
from rollstream.consumers.executor.jobs import Job, RunResult
from rollstream.consumers.executor.rewards import (
    PythonTests,
    RewardRegistry,
    Scored,
    default_registry,
    extract_code,
    length_component,
    parse_syntax_error,
    pass_component,
    weighted_reward,
)
from rollstream.schemas.events import RewardSpec

pytestmark = pytest.mark.unit

SPEC = RewardSpec(entry_point="f", tests=["assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 5"])


def result(events: list[dict], **kw) -> RunResult:
    return RunResult(sandbox_id="sbx", container_id="c", events=events, **kw)


def ok_run(passed: list[bool]) -> RunResult:
    events = [{"e": "compiled"}, {"e": "code_ok"}]
    events += [{"e": "test", "i": i, "ok": ok} for i, ok in enumerate(passed)]
    return result(events + [{"e": "done"}], exit_code=0)


# --- extraction -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code", "fenced", "language"),
    [
        ("```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x\n", True, "python"),
        ("Here:\n```py\nx = 1\n```", "x = 1\n", True, "py"),
        ("```\nx = 2\n```", "x = 2\n", True, ""),
        ("intro\n```bash\nls\n```\n```python\nx = 3\n```", "x = 3\n", True, "python"),
        ("```python\ndef f():\n    return 1", "def f():\n    return 1", True, "python"),  # truncated
        ("def f(x):\n    return x", "def f(x):\n    return x", False, ""),  # no fence: whole text
        ("~~~python\nx = 4\n~~~", "x = 4\n", True, "python"),
        ("````python\ns = '```'\n````", "s = '```'\n", True, "python"),
        ("```Python3\nx = 5\n```", "x = 5\n", True, "python3"),
    ],
)
def test_extract_code_takes_the_first_python_block(text, code, fenced, language):
    got = extract_code(text)
    assert (got.code, got.fenced, got.language) == (code, fenced, language)


@pytest.mark.parametrize("text", ["", "   \n\t", "```bash\nls -la\n```", "```python\n\n```"])
def test_extract_code_finds_nothing(text):
    assert extract_code(text).code is None


def test_second_python_block_is_ignored():
    assert extract_code("```python\na = 1\n```\n```python\nb = 2\n```").code == "a = 1\n"


@pytest.mark.parametrize(("language", "text", "code"), [
    ("cpp", "Plan:\n```python\nprint(1)\n```\n```c++\nint main(){}\n```", "int main(){}\n"),
    ("cpp", "```cpp\n#include <cstdio>\n```", "#include <cstdio>\n"),
    ("c", "```C\nint main(void){return 0;}\n```", "int main(void){return 0;}\n"),
    ("java", "```java\npublic class Main {}\n```", "public class Main {}\n"),
    ("javascript", "```js\nconsole.log(1)\n```", "console.log(1)\n"),
    ("go", "```golang\npackage main\n```", "package main\n"),
    ("rust", "```rs\nfn main() {}\n```", "fn main() {}\n"),
    ("rust", "fn main() {}", "fn main() {}"),  # no fence: the whole text, as for Python
])
def test_a_program_in_another_language_is_its_language_s_first_block(language, text, code):
    assert extract_code(text, language).code == code


@pytest.mark.parametrize(("language", "text"), [
    ("cpp", "```\nint main(){}\n```"),  # untagged: Python's, never another language's
    ("cpp", "```python\nprint(1)\n```"), ("java", "```javascript\nlet x\n```"), ("c", "```cpp\nint x;\n```"),
])
def test_a_block_of_another_language_is_no_code(language, text):
    assert extract_code(text, language).code is None


def test_a_language_this_executor_cannot_compile_is_no_reward_never_judged_as_python(monkeypatch):
    # every language of the task form has a toolchain now (test_programs.py): an executor without one is older
    monkeypatch.setattr(rewards_module, "RUNNABLE_LANGUAGES", frozenset({"python"}))
    spec = RewardSpec(language="cpp", program=True, tests=["assert run_program('') == '1\\n'"])
    scored = PythonTests().prepare(spec, "```cpp\nint main(){}\n```", "j")
    assert isinstance(scored, Scored) and scored.reward == 0.0 and scored.components == {}
    assert scored.execution.error_kind == "infra" and "does not compile cpp" in scored.execution.error_message


@pytest.mark.parametrize("fields", [dict(program=False), dict(program=True, kind="python_pytest")])
def test_a_task_in_another_language_is_a_whole_program_judged_by_python_tests(fields):
    with pytest.raises(ValueError, match="whole program"):
        RewardSpec(language="go", tests=["assert run_program('') == ''"], **fields)


# --- syntax errors ----------------------------------------------------------------------


def test_parse_syntax_error_from_traceback_text():
    text = '  File "<completion>", line 3\n    def f(:\n          ^\nSyntaxError: invalid syntax\n'
    info = parse_syntax_error(text)
    assert (info.kind, info.line, info.message) == ("SyntaxError", 3, "invalid syntax")


def test_parse_indentation_error_and_none():
    text = 'Traceback...\n  File "<completion>", line 7\n    return 1\nIndentationError: unexpected indent\n'
    info = parse_syntax_error(text)
    assert (info.kind, info.line, info.message) == ("IndentationError", 7, "unexpected indent")
    assert parse_syntax_error("ValueError: nope") is None


# --- components -------------------------------------------------------------------------


def test_components_and_weighted_sum():
    assert pass_component(2, 3, False, True) == pytest.approx(2 / 3)
    assert pass_component(2, 3, True, True) == 0.0
    assert pass_component(3, 3, True, True) == 1.0
    assert pass_component(0, 0, False, True) == 1.0
    assert pass_component(0, 0, False, False) == 0.0
    assert length_component("x" * 10, None) == 1.0
    assert length_component("x" * 10, 10) == 1.0
    assert length_component("x" * 15, 10) == pytest.approx(0.5)
    assert length_component("x" * 50, 10) == 0.0
    assert weighted_reward({"tests": 1.0, "format": 0.5}, {"tests": 0.5, "format": 1.0, "length": 1}) == 1.0
    assert weighted_reward({"tests": 1e9}, {"tests": 1.0}) == 1e6  # clamped to the schema's bound


# --- verdicts ---------------------------------------------------------------------------


def test_prepare_builds_the_job_or_penalises_no_code():
    kind = PythonTests()
    job = kind.prepare(SPEC, "```python\ndef f(x): return x + 1\n```", "g/0")
    assert isinstance(job, Job)
    assert (
        job.code == "def f(x): return x + 1\n" and job.tests == SPEC.tests and job.timeout_s == SPEC.timeout_s
    )
    verdict = kind.prepare(SPEC, "I don't know.\n```text\nno\n```", "g/1")
    assert isinstance(verdict, Scored)
    assert verdict.reward == SPEC.no_code_reward and verdict.execution.error_kind == "no_code"


def test_pass_fraction_and_all_or_nothing():
    kind = PythonTests()
    scored = kind.score(SPEC, "```python\n...\n```", ok_run([True, True, False]))
    assert scored.reward == pytest.approx(2 / 3)
    assert scored.execution.error_kind == "none"
    assert (scored.execution.tests_passed, scored.execution.tests_total) == (2, 3)
    strict = RewardSpec(tests=SPEC.tests, all_or_nothing=True)
    assert kind.score(strict, "x", ok_run([True, True, False])).reward == 0.0
    assert kind.score(strict, "x", ok_run([True, True, True])).reward == 1.0


def test_weighted_components_format_and_length():
    spec = RewardSpec(
        tests=["assert True"], weights={"tests": 1.0, "format": 0.2, "length": 0.3}, max_length_chars=20
    )
    kind = PythonTests()
    fenced = kind.score(spec, "```python\nx=1\n```", ok_run([True]))
    assert fenced.components == {"tests": 1.0, "format": 1.0, "length": 1.0}
    assert fenced.reward == pytest.approx(1.5)
    bare = kind.score(spec, "x = 1 # " + "y" * 22, ok_run([True]))  # 30 chars: length 0.5, no fence
    assert bare.components == {"tests": 1.0, "format": 0.0, "length": 0.5}
    assert bare.reward == pytest.approx(1.15)


def test_syntax_error_gives_its_reward_and_parsed_error():
    run = result(
        [{"e": "syntax", "type": "IndentationError", "line": 2, "msg": "unexpected indent"}], exit_code=1
    )
    scored = PythonTests().score(SPEC, "x", run)
    assert scored.reward == SPEC.syntax_error_reward == scored.components["penalty"]
    record = scored.execution
    assert (record.error_kind, record.error_line) == ("syntax", 2)
    assert record.error_message == "IndentationError: unexpected indent"


def test_syntax_line_falls_back_to_stderr():
    run = result(
        [{"e": "syntax", "type": "SyntaxError", "line": None, "msg": "bad"}],
        exit_code=1,
        stderr_tail='  File "<completion>", line 4\nSyntaxError: bad\n',
    )
    assert PythonTests().score(SPEC, "x", run).execution.error_line == 4


@pytest.mark.parametrize(
    ("run", "kind", "reward_field"),
    [
        (result([{"e": "compiled"}], timed_out=True), "timeout", "timeout_reward"),
        (result([{"e": "compiled"}], output_limit=True, output_bytes=10**6), "output_limit", "crash_reward"),
        (
            result([{"e": "compiled"}, {"e": "code_error", "type": "MemoryError", "msg": ""}], exit_code=1),
            "oom",
            "crash_reward",
        ),
        (
            result([{"e": "compiled"}], oom_killed=True, signal=9, violations=["oom_killed"]),
            "oom",
            "crash_reward",
        ),
        (result([{"e": "compiled"}], signal=11), "crash", "crash_reward"),
        (result([], runner_died=True, violations=["runner_died"]), "violation", "crash_reward"),
        (
            result(
                [{"e": "compiled"}, {"e": "code_ok"}, {"e": "done"}],
                exit_code=0,
                violations=["stray_processes:1"],
            ),
            "violation",
            "crash_reward",
        ),
        (
            result([{"e": "compiled"}], timed_out=True, violations=["runner_unresponsive"]),
            "timeout",
            "timeout_reward",
        ),
    ],
)
def test_fixed_rewards(run, kind, reward_field):
    scored = PythonTests().score(SPEC, "x", run)
    assert scored.execution.error_kind == kind
    assert scored.reward == getattr(SPEC, reward_field)
    assert scored.components == {"penalty": scored.reward}


def test_runtime_error_fails_every_test_and_keeps_the_line():
    run = result(
        [
            {"e": "compiled"},
            {"e": "code_error", "type": "NameError", "msg": "name 'y' is not defined", "line": 3},
        ],
        exit_code=1,
    )
    scored = PythonTests().score(SPEC, "x", run)
    assert scored.reward == 0.0
    assert (scored.execution.error_kind, scored.execution.error_line) == ("runtime", 3)
    assert "NameError" in scored.execution.error_message


def test_early_exit_counts_only_reported_passes():
    run = result([{"e": "compiled"}, {"e": "code_ok"}, {"e": "test", "i": 0, "ok": True}], exit_code=0)
    scored = PythonTests().score(SPEC, "x", run)
    assert scored.execution.error_kind == "runtime"
    assert scored.reward == pytest.approx(1 / 3)


def test_repeated_or_out_of_range_test_reports_do_not_count():
    events = [{"e": "compiled"}, {"e": "code_ok"}] + [{"e": "test", "i": 0, "ok": True}] * 10
    events += [{"e": "test", "i": 7, "ok": True}, {"e": "test", "i": "1", "ok": True}, {"e": "done"}]
    scored = PythonTests().score(SPEC, "x", result(events, exit_code=0))
    assert scored.execution.tests_passed == 1
    events = [
        {"e": "compiled"},
        {"e": "code_ok"},
        {"e": "test", "i": 1, "ok": False},
        {"e": "test", "i": 1, "ok": True},
        {"e": "done"},
    ]
    assert PythonTests().score(SPEC, "x", result(events, exit_code=0)).execution.tests_passed == 0


# --- registry ---------------------------------------------------------------------------


class Constant:
    components = frozenset({"constant"})

    def prepare(self, spec, completion, job_id):
        from rollstream.schemas.events import ExecutionRecord

        record = ExecutionRecord(sandbox_id="", exit_code=None, duration_s=0.0, error_kind="none")
        return Scored(
            reward=spec.weights.get("constant", 1.0), components={"constant": 1.0}, execution=record
        )

    def score(self, spec, completion, run):
        raise AssertionError("nothing runs")


def test_registry_plugs_in_a_kind_by_name_and_validates_weights():
    registry = default_registry(entry_points=[])
    assert registry.names() == ["math_answer", "python_pytest", "python_tests"]
    with pytest.raises(ValueError, match="unknown reward kind 'constant'"):
        registry.get(RewardSpec(kind="constant"))
    registry.register("constant", Constant())
    spec = RewardSpec(kind="constant", weights={"constant": 0.25})
    assert registry.get(spec).prepare(spec, "", "id").reward == 0.25
    with pytest.raises(ValueError, match="no component"):
        registry.get(RewardSpec(weights={"tests": 1.0, "style": 1.0}))


def test_registry_loads_entry_points():
    class FakeEntry:
        name = "constant"

        def load(self):
            return Constant

    assert "constant" in default_registry(entry_points=[FakeEntry()]).names()
    assert isinstance(RewardRegistry().names(), list)


def test_a_pytest_tasks_reference_record_carries_each_files_collected_count() -> None:
    """The count the reference's run collected per file goes with every job of the task (issue 52):
    the judge holds each file to it (runtime/pytests.py)."""
    from rollstream.consumers.executor.reference import ReferenceCheck
    from rollstream.consumers.executor.runtime.valuecheck import Rules

    check = ReferenceCheck(judged=True, in_process=True, recorded=True, tests=7, pytest=True, collected=[5, 2])
    rules = Rules(check.rules())
    assert rules.mode == "reference" and rules.collected == [5, 2]
    assert "collected" not in ReferenceCheck(judged=True, in_process=True, recorded=True, tests=2).rules()
    assert Rules({"mode": "reference", "collected": [3, "x", -1]}).collected == [3]  # what is not a count is dropped
