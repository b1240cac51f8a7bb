"""Math datasets read as they are published (rollstream/tasks/layouts.py, the math layouts): GSM8K,
MATH / hendrycks, NuminaMath, OpenR1-Math, DeepScaleR, Big-Math and multiple-choice rows (MMLU, ARC,
MMLU-Pro) become ``math_answer`` tasks with the gold each layout gives (fixtures in
tests/fixtures/layouts/, contents invented); a broken row is refused naming the row and the field; the
gold a completion must match scores through the executor's answer pool; and ``rollstream tasks check``
flags a gold answer that does not parse, without a sandbox, while its static checks still run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest

from rollstream.config import Config
from rollstream.consumers.executor.answers import MathAnswer, MathPool
from rollstream.errors import ConfigError
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks.intake import reasons_of, static_checks
from rollstream.tasks.layouts import BOXED_NOTE, CHOICE_NOTE, LayoutError, gsm8k_gold, last_boxed, layout_of
from rollstream.tasks.sources import load_tasks, split_tasks, task_from_row

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "layouts"
MATH_FIXTURES = ("gsm8k", "math", "numina", "openr1_math", "deepscaler", "big_math", "mmlu", "arc", "mmlu_pro")


def _load(name: str) -> list[TaskSpec]:
    return load_tasks([f"hf:{FIXTURES / name}.jsonl"])


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines()]


def _by_prompt(tasks: list[TaskSpec]) -> dict[str, TaskSpec]:
    return {(t.prompt or "").split("\n")[0]: t for t in tasks}


@pytest.fixture(scope="module")
def kind():
    kind = MathAnswer(MathPool(2))
    yield kind
    kind.close()


# --- each layout read, and its gold


def test_gsm8k_gold_follows_the_last_hashes_with_commas_dropped_and_the_solution_is_never_shown() -> None:
    tasks = _load("gsm8k")
    assert {layout_of(r).name for r in _rows("gsm8k")} == {"gsm8k"}
    assert sorted(t.reward.answer for t in tasks) == ["2100", "3.5", "31"]
    for task in tasks:
        assert task.reward.kind == "math_answer" and task.reward.answer_format == "boxed"
        assert task.family == "gsm8k" and task.task_id.startswith("gsm8k/h")
        assert task.prompt.endswith(BOXED_NOTE) and "####" not in task.prompt and "<<" not in task.prompt
        assert task.reference_solution and "####" in task.reference_solution  # the solution: the reference
    assert gsm8k_gold("a #### 3\nb #### 1,234,567", 0) == "1234567"
    assert gsm8k_gold("#### -1,000.5", 0) == "-1000.5"
    assert gsm8k_gold("#### 1,2", 0) == "1,2"  # not digit grouping: kept as written


def test_task_ids_are_stable_hashes_of_the_problem_and_a_repeat_is_numbered(tmp_path: Path) -> None:
    first = {t.task_id for t in _load("gsm8k")}
    rows = _rows("gsm8k")
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*reversed(rows), rows[0]]))
    again = [t.task_id for t in load_tasks([f"hf:{path}"])]
    assert set(again) - first == {f"{next(t.task_id for t in _load('gsm8k') if t.reward.answer == '31')}-2"}
    assert len(again) == 4


def test_math_gold_is_the_last_balanced_box_and_level_and_type_are_difficulty_and_family() -> None:
    tasks = _by_prompt(_load("math"))
    half = tasks["What is $\\frac{1}{2} + \\frac{1}{3}$?"]
    assert half.reward.answer == "\\frac{5}{6}" and half.family == "math/prealgebra" and half.difficulty == 1
    roots = tasks["Find the set of $x$ with $x^2 = 4$."]  # a first box earlier in the solution is not the answer
    assert roots.reward.answer == "\\{-2, 2\\}" and roots.family == "math/intermediate_algebra" and roots.difficulty == 3
    sqrt = tasks["Compute $\\sqrt{8}$ in simplest form."]
    assert sqrt.reward.answer == "2\\sqrt{2}" and sqrt.difficulty == 1  # "Level ?"
    assert all("boxed{" not in (t.prompt or "").replace("\\boxed{}", "") for t in tasks.values())
    assert all(t.reference_solution and t.reference_solution in _rows_solutions("math") for t in tasks.values())


def _rows_solutions(name: str) -> set[str]:
    return {r["solution"] for r in _rows(name)}


def test_last_boxed_balances_braces_and_reads_the_unbraced_form() -> None:
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # \{ is a literal brace
    assert last_boxed("\\fbox{7}.") == "7"
    assert last_boxed("so $\\boxed 5$.") == "5"
    assert last_boxed("\\boxed{2} and \\boxed{3") == "2"  # an unclosed box is no answer
    assert last_boxed("no box") is None


def test_numina_and_openr1_math_rows_with_their_messages_are_math_tasks() -> None:
    numina = _by_prompt(_load("numina"))
    assert numina["Solve $2x + 3 = 11$."].reward.answer == "4" and numina["Solve $2x + 3 = 11$."].family == "numina/cn_k12"
    assert numina["How many divisors does 12 have?"].reward.answer == "6"  # "$6$": its dollars off
    assert numina["Prove that the sum of two odd numbers is even."].reward.answer == "proof"  # flagged by tasks check
    openr1 = {t.task_id: t for t in _load("openr1_math")}
    ratio = openr1["openr1_math/6b1f0c4e-0000-5000-8000-000000000001"]  # its own uuid
    assert ratio.reward.answer == "25" and ratio.family == "openr1_math/algebra"
    assert ratio.reference_solution == "The parts are $15$ and $25$, so $\\boxed{25}$."
    assert "generations" not in ratio.prompt and ratio.prompt.endswith(BOXED_NOTE)


def test_deepscaler_and_big_math_rows_keep_their_answer_as_given() -> None:
    deep = _by_prompt(_load("deepscaler"))
    assert deep["What is $7 \\times 8$?"].reward.answer == "56"
    divide = deep["Evaluate $\\frac{3}{4} \\div \\frac{1}{2}$."]
    assert divide.reward.answer == "\\frac{3}{2}" and divide.reference_solution is None  # an empty solution
    big = _by_prompt(_load("big_math"))
    assert big["What is 15% of 80?"].reward.answer == "12" and big["What is 15% of 80?"].family == "big_math/orca_math"
    assert big["Write the interval of $x$ with $1 \\le x < 2$."].reward.answer == "[1, 2)"


def test_multiple_choice_rows_list_the_choices_lettered_and_the_gold_is_the_letter() -> None:
    mmlu = _by_prompt(_load("mmlu"))
    two = mmlu["What is 2 + 2?"]
    assert two.prompt == f"What is 2 + 2?\n\nA. 3\nB. 4\nC. 5\nD. 22\n\n{CHOICE_NOTE}"
    assert two.reward.answer == "B" and two.reward.answer_format == "regex" and two.family == "mmlu/elementary_mathematics"
    assert mmlu["Which is the largest planet?"].reward.answer == "C"
    arc = {t.task_id: t for t in _load("arc")}
    assert arc["arc/Mercury_7000001"].reward.answer == "B"
    balance = arc["arc/NYSEDREGENTS_2001_4_12"]  # numeric labels "1".."3", answerKey "2": the second choice
    assert balance.reward.answer == "B" and "A. ruler\nB. balance\nC. thermometer" in balance.prompt
    pro = {t.task_id: t for t in _load("mmlu_pro")}
    assert pro["mmlu_pro/70001"].reward.answer == "B" and "E. 0.4" in pro["mmlu_pro/70001"].prompt
    assert pro["mmlu_pro/70001"].family == "mmlu_pro/math"
    aqua = task_from_row({"question": "2 + 3?", "options": ["A)4", "B)5", "C)6"], "correct": "B"}, "aqua", 0)
    assert aqua.reward.answer == "B" and "A. 4\nB. 5\nC. 6" in aqua.prompt
    by_text = task_from_row({"question": "Capital?", "choices": ["Rome", "Paris"], "answer": "Paris"}, "q", 0)
    assert by_text.reward.answer == "B"


# --- the gold scores through the executor's answer pool


def test_each_layout_s_gold_is_what_a_right_completion_scores_with(kind) -> None:
    async def score(task: TaskSpec, completion: str) -> float:
        return (await kind.check(task.issued_reward(), completion)).components["answer"]

    async def main() -> None:
        for name in MATH_FIXTURES:
            for task in _load(name):
                if task.reward.answer in ("proof", "\\frac{3}{"):
                    continue  # flagged by tasks check (below)
                right = f"So the answer is $\\boxed{{{task.reward.answer}}}$."
                assert await score(task, right) == 1.0, (task.task_id, right)
        gsm = next(t for t in _load("gsm8k") if t.reward.answer == "2100")
        assert await score(gsm, "\\boxed{2,100}") == 1.0 and await score(gsm, "\\boxed{2101}") == 0.0
        two = _by_prompt(_load("mmlu"))["What is 2 + 2?"]
        assert await score(two, "4 is B, so \\boxed{(B)}") == 1.0
        assert await score(two, "\\boxed{\\text{B}}") == 1.0
        assert await score(two, "\\boxed{C}") == 0.0
        assert await score(two, "\\boxed{4}") == 0.0  # the choice's text is no letter: no answer
        assert await score(two, "\\boxed{b}") == 0.0  # one capital letter, as the prompt says
        assert await score(two, "\\boxed{B} or \\boxed{C}") == 0.0  # a hedge
        assert await score(two, "The answer is B") == 0.0  # not where the task says
    asyncio.run(main())


# --- broken rows


def _refused(tmp_path: Path, rows: list[dict], bad: int, field: str) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError) as caught:
        load_tasks([f"hf:{path}"])
    message = str(caught.value)
    assert f"row {bad}: field {field!r}" in message, message
    return message


def test_broken_rows_are_refused_naming_the_row_and_the_field(tmp_path: Path) -> None:
    good_q = {"question": "1 + 1?", "answer": "#### 2"}
    assert "nothing after its last '####'" in _refused(tmp_path, [good_q, {"question": "x?", "answer": "so ####"}], 1,
                                                       "answer")
    assert "without GSM8K's final" in _refused(tmp_path, [good_q, {"question": "x?", "answer": "a\nb"}], 1, "answer")
    _refused(tmp_path, [good_q, {"question": "", "answer": "#### 3"}], 1, "question")
    good_p = {"problem": "1 + 1?", "solution": "\\boxed{2}"}
    assert "no \\boxed" in _refused(tmp_path, [good_p, {"problem": "x?", "solution": "it is 3"}], 1, "solution")
    _refused(tmp_path, [good_p, {"problem": "x?", "solution": "\\boxed{3", "answer": ""}], 1, "solution")
    good_c = {"question": "1 + 1?", "choices": ["1", "2"], "answer": 1}
    assert "choice 5 of 2" in _refused(tmp_path, [good_c, {"question": "x?", "choices": ["1", "2"], "answer": 5}], 1,
                                       "answer")
    _refused(tmp_path, [good_c, {"question": "x?", "choices": ["1", "2"], "answer": "Z"}], 1, "answer")
    _refused(tmp_path, [good_c, {"question": "x?", "choices": ["only"], "answer": 0}], 1, "choices")
    _refused(tmp_path, [good_c, {"question": "x?", "choices": ["1", ""], "answer": 0}], 1, "choices")
    with pytest.raises(LayoutError, match="field 'choices'"):
        task_from_row({"question": "x?", "choices": {"text": ["1", "2"], "label": ["A"]}, "answer": "A"}, "q", 3)
    with pytest.raises(LayoutError, match="field 'answer'"):
        task_from_row({"problem": "x?", "answer": {"value": 3}}, "q", 4)


# --- the sampler, export and tasks check


def test_export_and_the_sampler_s_split_read_math_tasks(tmp_path: Path, capsys) -> None:
    from rollstream.cli.main import main

    sources = [f"hf:{FIXTURES / name}.jsonl" for name in MATH_FIXTURES]
    out = tmp_path / "math.jsonl"
    assert main(["tasks", "export", *sources, "-o", str(out)]) == 0
    exported = load_tasks([f"jsonl:{out}"])
    original = load_tasks(sources)
    assert {t.task_id: msgspec.to_builtins(t) for t in exported} == {t.task_id: msgspec.to_builtins(t) for t in original}
    assert len(exported) == 23 and "wrote 23 tasks" in capsys.readouterr().err
    trained, held = split_tasks(exported, 0.25, seed=0)
    assert held and {t.family for t in held} == {t.family for t in exported}
    assert len(trained) + len(held) == 23


def test_tasks_check_flags_an_answer_that_does_not_parse_without_a_sandbox(tmp_path: Path, capsys) -> None:
    from rollstream.cli.main import main

    report = tmp_path / "intake.json"
    checks = tmp_path / "checks.json"
    code = main(["tasks", "check", f"hf:{FIXTURES / 'numina.jsonl'}", f"hf:{FIXTURES / 'big_math.jsonl'}",
                 f"hf:{FIXTURES / 'gsm8k.jsonl'}", f"hf:{FIXTURES / 'mmlu.jsonl'}", "--json", str(checks),
                 "--set", f"intake.report={report}"])
    printed = capsys.readouterr().out
    assert code == 1  # two tasks fail
    assert "0 sandbox executions" in printed
    found = {t["task_id"]: t for t in json.loads(checks.read_text())["tasks"]}
    failing = {task_id: t["reasons"] for task_id, t in found.items() if t["reasons"]}
    assert sorted(failing.values()) == [["answer_does_not_parse"], ["answer_does_not_parse"]]
    assert printed.count("answer does not parse:") == 2
    assert "'proof' is a placeholder" in printed and "the CAS does not read it" in printed
    gsm = [t for t in found.values() if t["family"] == "gsm8k"]
    assert all(t["answer_parses"] and t["reference_passes"] for t in gsm)  # each solution reaches its gold
    assert all(t["reference_passes"] is None for t in found.values() if t["family"].startswith("mmlu"))


def test_a_reference_that_reaches_another_answer_fails_and_static_checks_run_on_math_prompts(tmp_path: Path) -> None:
    from rollstream.cli.intake import run_checks

    rows = [{"problem": "What is 6 times 7?", "solution": "It is $\\boxed{41}$.", "answer": "42", "source": "s"},
            {"problem": "What is 6 times 7?", "solution": "\\boxed{42}", "answer": "42", "source": "s"},
            {"problem": "Write to jane.roe@acme-mail.com: what is 2 + 5?", "answer": "7", "source": "s"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks([f"hf:{path}"])
    config = Config()
    checks, static, figures = asyncio.run(run_checks(config, tasks))
    by_id = {c.task_id: c for c in checks}
    assert figures["executions"] == 0
    wrong, right = sorted((c for c in checks if not c.personal_data), key=lambda c: c.task_id)
    assert right.task_id == f"{wrong.task_id}-2"  # the same problem twice: the repeat numbered
    assert "reference_fails" in wrong.reasons and "'41'" in wrong.reference_message
    assert right.reference_passes and wrong.duplicates == [right.task_id]  # duplicates found among math prompts
    email = next(c for c in checks if c.personal_data)
    assert email.reasons == ["personal_data"] and by_id[email.task_id].answer_parses
    assert static.clusters and reasons_of(right, config.intake) == []
    assert static_checks(tasks, [], [], config.intake).personal_data


def test_a_math_task_s_wrong_solution_that_reaches_the_gold_is_a_finding() -> None:
    from rollstream.cli.intake import run_checks
    from rollstream.schemas.events import RewardSpec

    def task(task_id: str, wrong: str) -> TaskSpec:
        return TaskSpec(task_id=task_id, family="m", prompt=f"{task_id}: what is 10 / 4?",
                        reward=RewardSpec(kind="math_answer", answer="5/2"),
                        reference_solution="10 / 4 = $\\boxed{\\frac{5}{2}}$", wrong_solutions=[wrong])

    tasks = [task("m/ok", "\\boxed{3}"), task("m/weak", "so \\boxed{2.5}")]
    checks = {c.task_id: c for c in asyncio.run(run_checks(Config(), tasks))[0]}
    assert checks["m/ok"].reasons == [] and checks["m/ok"].reference_passes
    assert checks["m/weak"].reasons == ["wrong_solution_passes"] and checks["m/weak"].wrong_passing == [0]
