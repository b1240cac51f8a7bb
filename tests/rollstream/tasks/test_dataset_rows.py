"""Dataset fields are data (issue 52, item 2): every name a row supplies is a Python identifier or the
row is refused naming the row and the field; decoders bound what they build (values counted each time
they are reached, depth), not only the bytes they read; a broken line of an hf: JSON lines file is an
error naming the file and the line. Each hostile case is refused with its reason; honest rows load."""

from __future__ import annotations

import base64
import json
import pickle
import sys
import zlib
from pathlib import Path

import msgspec
import pytest

from rollstream.errors import ConfigError
from rollstream.schemas.events import RewardSpec
from rollstream.tasks import layouts
from rollstream.tasks.layouts import LayoutError, asserted_call, bounded_value, decode_test_cases, python_name
from rollstream.tasks.sources import humaneval_tasks, jsonl_tasks, load_tasks, task_from_row

pytestmark = pytest.mark.unit

HOSTILE_NAMES = ["(lambda *a: 1) or f", "__import__('os').system('touch /tmp/x') or f", "f(1) == 1 or f",
                 "Solution().f", "class", "None", "1f", "f\n", "f g", "", ]
HONEST_NAMES = ["f", "maxOf", "_helper", "sum_of_digits2", "naïve", "match"]  # soft keywords are names


def _packed(value: object) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(value))).decode()


def _taco(fn_name: object) -> dict:
    return {"problem_id": 1, "question": "Return the larger of a and b.",
            "input_output": json.dumps({"fn_name": fn_name, "inputs": [[1, 2]], "outputs": [2]})}


def _livecodebench(func_name: object, **fields: object) -> dict:
    row = {"question_id": "q1", "question_content": "Return n doubled.", "starter_code": "",
           "public_test_cases": json.dumps([{"input": "3", "output": "6", "testtype": "functional"}]),
           "metadata": json.dumps({"func_name": func_name})}
    return {**row, **fields}


def _open_r1(fn_name: object) -> dict:
    cases = [{"fn_name": fn_name, "input": [3], "output": 6, "type": "function_call"}]
    return {"problem_id": "vfc_1", "prompt": "Double n.",
            "verification_info": json.dumps({"language": "python", "test_cases": cases})}


# --- names


@pytest.mark.parametrize("name", HOSTILE_NAMES[:-1])
def test_a_name_that_is_code_is_refused_in_every_layout_naming_row_and_field(name: str) -> None:
    for row, field in ((_taco(name), "input_output.fn_name"), (_livecodebench(name), "metadata.func_name"),
                       (_open_r1(name), "verification_info.test_cases.fn_name")):
        with pytest.raises(LayoutError, match=rf"row 5: field '{field}': .* is not a Python identifier") as caught:
            task_from_row(row, "x", 5)
        assert (caught.value.row, caught.value.field) == (5, field)
    with pytest.raises(ConfigError, match=r"row 5: field 'entry_point': .* is not a Python identifier"):
        task_from_row({"task_id": "H/1", "prompt": "def f():\n", "test": "def check(c):\n    assert c()\n",
                       "entry_point": name}, "humaneval", 5)


@pytest.mark.parametrize("name", HONEST_NAMES)
def test_a_real_identifier_still_becomes_the_calls(name: str) -> None:
    assert task_from_row(_taco(name), "x", 0).reward.tests == [f"assert {name}(1, 2) == 2"]
    lcb = task_from_row(_livecodebench(name), "x", 0)
    assert lcb.reward.entry_point == name and lcb.reward.tests == [f"assert {name}(3) == 6"]
    assert task_from_row(_open_r1(name), "x", 0).reward.tests == [f"assert {name}(3) == 6"]
    human = task_from_row({"task_id": "H/1", "prompt": f"def {name}():\n", "test": "def check(c):\n    assert c()\n",
                           "entry_point": name}, "humaneval", 0)
    assert human.reward.tests[0].endswith(f"check({name})\n")


def test_a_name_that_is_not_text_is_refused_not_a_traceback() -> None:
    for value in ([1], {"a": 1}, 3, True):
        with pytest.raises(LayoutError, match=r"row 2: field 'input_output.fn_name': .* not a Python identifier"):
            task_from_row(_taco(value), "x", 2)
        with pytest.raises(LayoutError, match=r"row 2: field 'verification_info.test_cases.fn_name'"):
            task_from_row(_open_r1(value), "x", 2)  # a list as fn_name: once an unhashable-type traceback
    with pytest.raises(LayoutError, match=r"row 2: field 'starter_code': expected text"):
        task_from_row(dict(_taco("f"), starter_code=["class Solution:"]), "x", 2)


def test_the_hostile_name_that_scored_without_defining_anything_makes_no_task() -> None:
    """``(lambda *a: 1) or f``: pasted as it was, every call is the lambda's and a completion that
    defines nothing passes; refused, no test holds it."""
    with pytest.raises(LayoutError):
        task_from_row(_taco("(lambda *a: 1) or f"), "taco", 0)
    for name in HOSTILE_NAMES:  # the schema holds the same line for a task from any source
        if name:
            with pytest.raises(msgspec.ValidationError, match="not a Python identifier"):
                msgspec.convert({"entry_point": name, "tests": ["assert True"]}, RewardSpec)
    assert msgspec.convert({"entry_point": "", "tests": ["assert True"]}, RewardSpec).entry_point == ""


def test_python_name_and_asserted_call() -> None:
    assert python_name("f", 0, "x") == "f"
    with pytest.raises(LayoutError, match=r"'for' is not a Python identifier"):
        python_name("for", 0, "x")
    assert asserted_call(["assert not(f(1))"]) == "f"  # once "not"
    assert asserted_call(["assert not_found(1) == 2"]) == "not_found"
    assert asserted_call(['x = "assert import (1)"; assert g(1)']) == "g"  # a keyword is never the entry point
    assert asserted_call(["assert True"]) == ""


def test_mbpp_and_acecode_rows_read_their_entry_point_as_a_name() -> None:
    mbpp = task_from_row({"task_id": 3, "text": "Add.", "test_list": ["assert not(is_odd(2))"], "code": ""}, "mbpp")
    assert mbpp.reward.entry_point == "is_odd"
    with pytest.raises(ConfigError, match=r"row 4: field 'test_list': expected a list of assert statements"):
        task_from_row({"task_id": 3, "text": "Add.", "test_list": "assert f(1)"}, "mbpp", 4)
    with pytest.raises(ConfigError, match=r"row 4: field 'text': expected text"):
        task_from_row({"task_id": 3, "text": ["Add."], "test_list": ["assert f(1)"]}, "mbpp", 4)


# --- decoders bound what they build


def _shared(levels: int) -> list:
    """A list that is ``2**levels`` strings long when written out, a few hundred bytes pickled."""
    value: list = ["x" * 64]
    for _ in range(levels):
        value = [value, value]
    return value


def test_a_pickle_whose_lists_share_references_is_refused_before_it_grows() -> None:
    tiny = _packed(_shared(40))  # 2**40 strings of 64 characters as the tests would write them
    assert len(tiny) < 1000
    with pytest.raises(LayoutError, match=r"row 3: field 'private_test_cases': holds more than \d+ "
                                          r"(values|characters).*shared by reference"):
        decode_test_cases(tiny, 3, "private_test_cases")
    with pytest.raises(LayoutError, match="shared by reference"):  # a string shared by reference, many times
        decode_test_cases(_packed([["y" * 100_000] * 1000] * 1000), 3, "private_test_cases")
    row = _livecodebench("f", public_test_cases=json.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]),
                         private_test_cases=tiny)
    with pytest.raises(ConfigError, match=r"row 0: field 'private_test_cases': holds more than"):
        task_from_row(row, "livecodebench", 0)


def test_a_deep_pickle_or_json_is_refused_not_a_recursion_error() -> None:
    deep = pickle.PROTO + b"\x02" + pickle.EMPTY_LIST * 200_000 + pickle.APPEND * 199_999 + pickle.STOP
    packed = base64.b64encode(zlib.compress(deep)).decode()  # a 200,000-deep list (pickle.dumps cannot write one)
    with pytest.raises(LayoutError, match=rf"row 1: field 'private_test_cases': nested deeper than {layouts.MAX_DEPTH}"):
        decode_test_cases(packed, 1, "private_test_cases")
    text = "[" * 200_000 + "]" * 200_000
    with pytest.raises(LayoutError, match=r"row 1: field 'private_test_cases': JSON nested too deeply"):
        decode_test_cases(text, 1, "private_test_cases")
    with pytest.raises(LayoutError, match=r"row 1: field 'private_test_cases': JSON nested too deeply"):
        decode_test_cases(_packed(text), 1, "private_test_cases")  # the JSON string inside the pickle
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(LayoutError, match="nested deeper than"):
        decode_test_cases(_packed(cyclic), 1, "private_test_cases")
    for row, field in ((dict(_taco("f"), input_output=text), "input_output"),
                       (_open_r1("f") | {"verification_info": text}, "verification_info"),
                       (_livecodebench("f", metadata=text), "metadata"),
                       (_livecodebench("f", public_test_cases=json.dumps(
                           [{"input": text, "output": "6", "testtype": "functional"}])), "public_test_cases"),
                       (_livecodebench("f", public_test_cases=json.dumps(
                           [{"input": "3", "output": text, "testtype": "functional"}])), "public_test_cases")):
        with pytest.raises(LayoutError, match=rf"row 6: field '{field}': JSON nested too deeply"):
            task_from_row(row, "x", 6)
    fifty = "[" * 50 + "1" + "]" * 50  # honest nesting reads as before
    assert bounded_value(json.loads(fifty), 0, "f") == json.loads(fifty)


def test_a_deep_value_given_already_parsed_is_bounded_too() -> None:
    deep: list = [1]
    for _ in range(10_000):
        deep = [deep]
    row = {"problem_id": 1, "question": "?", "input_output": {"fn_name": "f", "inputs": [[deep]], "outputs": [1]}}
    with pytest.raises(LayoutError, match=r"row 0: field 'input_output': nested deeper than"):
        task_from_row(row, "x", 0)


def test_a_huge_integer_is_refused_with_row_and_field() -> None:
    huge = _packed([{"input": "1", "output": 10 ** 10_000, "testtype": "stdin"}])  # more digits than str() writes
    row = _livecodebench("f", public_test_cases=json.dumps([{"input": "1", "output": "1", "testtype": "stdin"}]),
                         private_test_cases=huge)
    with pytest.raises(LayoutError, match=r"row 0: field 'public_test_cases': a program's input or output"):
        task_from_row(row, "x", 0)
    calls = _packed([{"input": "1", "output": 10 ** 10_000, "testtype": "functional"}])
    with pytest.raises(LayoutError, match=r"row 0: field 'public_test_cases'"):
        task_from_row(_livecodebench("f", private_test_cases=calls), "x", 0)


def test_honest_pickles_and_json_of_a_normal_size_still_decode() -> None:
    cases = [{"input": f"{n}\n" + " ".join(map(str, range(n))) + "\n", "output": f"{n * (n - 1) // 2}\n",
              "testtype": "stdin"} for n in range(1, 200)]
    assert decode_test_cases(_packed(json.dumps(cases)), 0, "private_test_cases") == cases
    assert decode_test_cases(_packed(cases), 0, "private_test_cases") == cases
    assert decode_test_cases(json.dumps(cases), 0, "public_test_cases") == cases
    shared = ["same"] * 10_000  # shared references within the bounds are fine: counted, not refused
    assert decode_test_cases(_packed([{"input": shared, "output": "x", "testtype": "stdin"}]), 0, "f")[0]["input"] \
        == shared
    big = [{"input": "9" * 1_000_000, "output": "1", "testtype": "stdin"}]  # one large honest input
    assert decode_test_cases(_packed(json.dumps(big)), 0, "f") == big


def test_the_bounds_are_the_module_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layouts, "MAX_VALUES", 100)
    with pytest.raises(LayoutError, match="more than 100 values"):
        bounded_value(list(range(101)), 0, "f")
    assert bounded_value(list(range(99)), 0, "f") == list(range(99))
    monkeypatch.setattr(layouts, "MAX_DECODED", 1000)
    with pytest.raises(LayoutError, match="more than 1000 characters"):
        bounded_value(["x" * 600] * 2, 0, "f")


# --- files


def test_a_broken_line_of_an_hf_jsonl_source_names_the_file_and_the_line(tmp_path: Path) -> None:
    good = json.dumps(_taco("f"))
    path = tmp_path / "rows.jsonl"
    path.write_text(good + "\n" + json.dumps(dict(_taco("g"), problem_id=2)) + "\n{\"question\": \"?\", broken\n")
    with pytest.raises(ConfigError, match=rf"hf source {path}:3: not JSON") as caught:
        load_tasks([f"hf:{path}"])
    assert "Traceback" not in str(caught.value)
    deep = tmp_path / "deep.jsonl"
    deep.write_text(good + "\n" + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(ConfigError, match=rf"hf source {deep}"):
        load_tasks([f"hf:{deep}"])
    inside = tmp_path / "inside.jsonl"  # a deep field: the loader's own C parser once crashed the process on it
    inside.write_text(good + "\n" + '{"question": "q", "input_output": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    with pytest.raises(ConfigError, match=rf"hf source {inside}:2: not JSON: nested too deeply"):
        load_tasks([f"hf:{inside}"])
    document = tmp_path / "rows.json"
    document.write_text("[\n" + good + ",\n{oops}\n]\n")
    with pytest.raises(ConfigError, match=rf"hf source {document}:3: not JSON"):
        load_tasks([f"hf:{document}"])
    fine = tmp_path / "fine.jsonl"
    fine.write_text(good + "\n")
    assert [t.task_id for t in load_tasks([f"hf:{fine}"])] == ["fine/1"]


def test_a_row_whose_fields_have_the_wrong_types_is_a_row_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"task_id": "H/1", "prompt": 5, "test": "t", "entry_point": "f"}) + "\n")
    with pytest.raises(ConfigError, match=r"row 0: field 'prompt': expected text"):
        load_tasks([f"hf:{path}"])


def test_a_taskspec_row_s_entry_point_is_a_name_too(tmp_path: Path) -> None:
    row = {"task_id": "t/1", "prompt": "p", "reward": {"entry_point": "(lambda *a: 1) or f", "tests": ["assert f()"]}}
    with pytest.raises(ConfigError, match=r"row 3: not a task: entry_point .* is not a Python identifier"):
        task_from_row(row, "t", 3)
    row["reward"]["entry_point"] = "f"
    assert task_from_row(row, "t", 3).reward.entry_point == "f"


def test_humaneval_and_jsonl_files_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "HumanEval.jsonl"
    honest = {"task_id": "H/0", "prompt": "def f():\n", "test": "def check(c):\n    assert c() == 1\n",
              "entry_point": "f", "canonical_solution": "    return 1\n"}
    path.write_text(json.dumps(honest) + "\n" + json.dumps(dict(honest, task_id="H/1", entry_point="f) or (f")) + "\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: field 'entry_point': 'f\) or \(f' is not a Python identifier"):
        humaneval_tasks(path)
    path.write_text(json.dumps(honest) + "\n{broken\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: not JSON"):
        humaneval_tasks(path)
    path.write_text(json.dumps(honest) + "\n")
    assert [t.task_id for t in humaneval_tasks(path)] == ["H/0"]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "a", "family": "f", "prompt": "p", "reward": {"tests": [' * 1 + "[" * 200_000 + "\n")
    with pytest.raises(ConfigError, match=rf"{tasks}:1: not a task"):
        jsonl_tasks(tasks)


def test_recursion_limit_is_left_as_it_was() -> None:
    before = sys.getrecursionlimit()
    with pytest.raises(LayoutError):
        decode_test_cases("[" * 100_000, 0, "f")
    assert sys.getrecursionlimit() == before
