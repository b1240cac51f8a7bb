"""Published dataset rows read as they are (rollstream/tasks/layouts.py): each adapter on its
fixture (rows in the published field layout, contents invented), LiveCodeBench's compressed tests
decoded without executing anything, clear errors naming the row and the field, and `rollstream
tasks export` writing what a source yields."""

from __future__ import annotations

import base64
import json
import os
import pickle
import zlib
from pathlib import Path

import msgspec
import pytest

from rollstream.errors import ConfigError
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks import layouts
from rollstream.tasks.layouts import LayoutError, decode_test_cases, pytest_entry_point
from rollstream.tasks.sources import load_tasks, task_from_row

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "layouts"


def _row(name: str, index: int) -> dict:
    return json.loads((FIXTURES / name).read_text().splitlines()[index])


def _load(name: str) -> dict[str, TaskSpec]:
    return {t.task_id: t for t in load_tasks([f"hf:{FIXTURES / name}"])}


def test_taco_apps_rows_become_programs_and_calls_with_their_own_ids() -> None:
    tasks = _load("taco.jsonl")
    assert set(tasks) == {"taco/4001", "taco/4002", "taco/4003"}
    stdin = tasks["taco/4001"]
    assert stdin.reward.program and stdin.reward.tests[0] == "assert run_program('2 3\\n').split() == '5\\n'.split()"
    assert stdin.reference_solution and "print(a + b)" in stdin.reference_solution
    method = tasks["taco/4002"]  # class Solution in the starter code; outputs wrapped in a list (APPS)
    assert method.reward.entry_point == "Solution" and not method.reward.program
    assert method.reward.tests[0] == "_result = Solution().maxOf([1, 5, 2])\nassert _result == [5] or _result == 5"
    assert "class Solution" in (method.prompt or "")
    assert tasks["taco/4003"].reward.tests == ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0"]


def test_livecodebench_rows_read_both_test_encodings() -> None:
    tasks = _load("livecodebench.jsonl")
    stdin = tasks["livecodebench/abc900_a"]
    assert stdin.reward.program and len(stdin.reward.tests) == 3  # 1 public + 2 private (base64/zlib/pickle)
    assert stdin.reward.tests[1] == "assert run_program('1\\n7\\n').split() == '7\\n'.split()"
    digits = tasks["livecodebench/9001"]  # functional, plain JSON private tests
    assert digits.reward.entry_point == "Solution"
    assert digits.reward.tests == ["assert Solution().sumOfDigits(123) == 6", "assert Solution().sumOfDigits(9) == 9",
                                   "assert Solution().sumOfDigits(0) == 0"]
    assert tasks["livecodebench/9002"].reward.tests == ["assert Solution().product(3, 4) == 12",
                                                        "assert Solution().product(-2, 5) == -10"]


def test_open_r1_rows_in_both_published_forms() -> None:
    tasks = _load("open_r1.jsonl")  # PrimeIntellect's: prompt, verification_info as a JSON string
    assert set(tasks) == {"open_r1/vfc_900", "open_r1/vfc_901"}
    assert tasks["open_r1/vfc_900"].reference_solution == "n = int(input())\nprint(2 * n)\n"  # unfenced
    assert tasks["open_r1/vfc_901"].reference_solution == "print(' '.join(input().split()[::-1]))\n"
    python = _load("open_r1_python.jsonl")  # open-r1's: problem_statement, verification_info an object
    assert python["open_r1_python/vfc_902"].reward.program
    calls = python["open_r1_python/vfc_903"]
    assert calls.reward.entry_point == "add_one" and not calls.reward.program
    assert calls.reward.tests[0] == "_result = add_one([1, 2])\nassert _result == [[2, 3]] or _result == [2, 3]"


def test_acecode_and_kodcode_rows() -> None:
    ace = _load("acecode.jsonl")
    assert ace["acecode/oss_900"].reward.entry_point == "clamp" and len(ace["acecode/oss_900"].reward.tests) == 3
    kod = _load("kodcode.jsonl")
    reverse = kod["kodcode/Prefill_900"]
    assert reverse.reward.entry_point == "reverse" and reverse.reference_solution == "def reverse(s):\n    return s[::-1]\n"
    assert reverse.reward.kind == "python_pytest" and reverse.reward.tests == [_row("kodcode.jsonl", 0)["test"]]
    ports = kod["kodcode/Apps_902"]  # fixtures, parametrize, raises, a test class: pytest's own
    assert ports.reward.entry_point == "parse_port" and ports.reward.tests[0].startswith("import pytest\n")


def test_compressed_test_cases_run_nothing_and_refuse_what_is_not_plain_data(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):  # what a hostile row would carry: a call on unpickling
            return (os.system, (f"touch {marker}",))

    hostile = base64.b64encode(zlib.compress(pickle.dumps(Payload()))).decode()
    with pytest.raises(LayoutError, match=r"row 7: field 'private_test_cases': not plain data.*refused.*system"):
        decode_test_cases(hostile, 7, "private_test_cases")
    assert not marker.exists()
    nested = base64.b64encode(zlib.compress(pickle.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]))).decode()
    assert decode_test_cases(nested, 0, "f") == [{"input": "1", "output": "1", "testtype": "stdin"}]
    for bad, reason in (("not base64!!", "not plain data"), (base64.b64encode(b"xyz").decode(), "not plain data"),
                        (base64.b64encode(zlib.compress(pickle.dumps(3))).decode(), "payload is a int")):
        with pytest.raises(LayoutError, match=reason):
            decode_test_cases(bad, 2, "private_test_cases")


def test_a_decompression_bomb_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layouts, "MAX_DECODED", 1000)
    big = base64.b64encode(zlib.compress(pickle.dumps("[" + "1," * 5000 + "1]"))).decode()
    with pytest.raises(LayoutError, match="more than 1000 bytes"):
        decode_test_cases(big, 3, "private_test_cases")


def test_errors_name_the_row_and_the_field_and_nothing_is_half_loaded(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"row 4: keys \['hint', 'question'\] fit no layout.*taco"):
        task_from_row({"question": "?", "hint": "42"}, "x", 4)  # (question and answer: GSM8K's, a math task)
    good = json.loads((FIXTURES / "taco.jsonl").read_text().splitlines()[0])
    broken = dict(good, problem_id=5, input_output="{not json")
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(ConfigError, match=r"row 1: field 'input_output': not JSON"):
        load_tasks([f"hf:{path}"])
    with pytest.raises(LayoutError, match=r"row 2: field 'input_output': empty.*dataset.filter"):
        task_from_row(dict(good, input_output=""), "x", 2)  # APPS publishes rows without tests so
    uneven = dict(good, input_output=json.dumps({"inputs": ["1"], "outputs": []}))
    with pytest.raises(LayoutError, match=r"row 0: field 'input_output': 1 inputs, 0 outputs"):
        task_from_row(uneven, "x", 0)


def test_a_pytest_file_s_entry_point_is_what_it_takes_from_solution() -> None:
    for source, reason in (("def test_a(:\n", "row 9: field 'test': does not parse"),
                           ("from solution import f\nX = f\n", "no test functions or classes"),
                           ("def test_a():\n    assert True\n", "takes nothing from solution")):
        with pytest.raises(LayoutError, match=reason):
            pytest_entry_point(source, 9)
    assert pytest_entry_point("import pytest\nfrom solution import f, g\n\ndef test_a(tmp_path):\n    assert f()\n", 0) == "f"
    assert pytest_entry_point("import solution as s\n\nclass TestF:\n    def test_a(self):\n        assert s.h()\n", 0) == "h"


def test_export_writes_what_a_source_yields_and_it_loads_back(tmp_path: Path, capsys) -> None:
    from rollstream.cli.main import main

    out = tmp_path / "tasks.jsonl"
    assert main(["tasks", "export", f"hf:{FIXTURES / 'taco.jsonl'}", f"hf:{FIXTURES / 'kodcode.jsonl'}",
                 "-o", str(out)]) == 0
    exported = load_tasks([f"jsonl:{out}"])
    original = load_tasks([f"hf:{FIXTURES / 'taco.jsonl'}", f"hf:{FIXTURES / 'kodcode.jsonl'}"])
    assert {t.task_id: msgspec.to_builtins(t) for t in exported} == {t.task_id: msgspec.to_builtins(t) for t in original}
    assert "wrote 6 tasks (kodcode, taco)" in capsys.readouterr().err
    assert main(["tasks", "export", f"hf:{FIXTURES / 'taco.jsonl'}"]) == 2  # no -o: a clear error
