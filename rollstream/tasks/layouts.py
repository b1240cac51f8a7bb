"""Published dataset rows read as they are: one adapter per layout, each turning a row into a
TaskSpec (``hf:PATH`` sources; ``rollstream tasks export`` shows what an adapter made of them).

=================  =========================================================  ==========================
layout             a row has                                                  tests become
=================  =========================================================  ==========================
taskspec           ``reward`` or ``messages`` (schemas/tasks.py)              as given
humaneval          ``prompt``, ``test``, ``entry_point``                      ``check(entry_point)``
mbpp               ``text``, ``test_list``                                    the asserts
taco (TACO, APPS,  ``question``, ``input_output`` (JSON: ``inputs``,         stdin/stdout programs, or
CodeContests)      ``outputs``, ``fn_name`` when call-based), ``solutions``   calls of ``fn_name``
livecodebench      ``question_content``, ``public_test_cases``,               stdin/stdout programs, or
                   ``private_test_cases`` (JSON, or base64 of zlib of a       calls of
                   pickled JSON string), ``metadata`` (``func_name``),        ``metadata.func_name``
                   ``starter_code``
open-r1            ``prompt`` (or ``problem_statement``, ``problem``),        stdin/stdout programs, or
                   ``verification_info`` (JSON or an object: ``test_cases``   calls of ``fn_name``
                   with ``input``, ``output``, ``type``: stdin_stdout or
                   function_call), ``gold_standard_solution`` (fenced or not)
acecode            ``question``, ``test_cases`` (assert statements)           the asserts
kodcode            ``question``, ``solution``, ``test`` (``test_code`` in     the file, run by pytest
                   the earlier revision: a pytest file)
multiple-choice    ``question``, ``choices`` (a list, or ``label``/``text``)  ``math_answer``: the
                   or ``options``, ``answer`` (letter, index, label, text)    letter, boxed
                   or ``answerKey`` or ``correct``
gsm8k              ``question``, ``answer`` (ending ``#### n``)               ``math_answer``: n
math (MATH,        ``problem``, ``answer`` or ``solution`` (its last          ``math_answer``
NuminaMath,        ``\\boxed{}``), ``level``, ``type``, ``source``
OpenR1-Math,
DeepScaleR,
Big-Math)
=================  =========================================================  ==========================

The math layouts (:data:`MATH_LAYOUTS`, read after the code layouts: a code row has its tests) make
``math_answer`` tasks: the gold answer read from the row, the solution (never shown) the reference,
the prompt asking for the final answer in ``\\boxed{}``; a multiple-choice row's gold is its letter,
read by :data:`CHOICE_PATTERN` (a boxed capital letter: a letter compares as a letter). A gold that
loads but does not parse is ``rollstream tasks check``'s finding (``answer_does_not_parse``), not a
refusal.

A program's output is compared token by token (``split()``: line breaks and runs of spaces
alike), which the datasets' own checkers accept too (APPS' cascade ends with whitespace-split
tokens; LiveCodeBench strips lines); their float tolerance (APPS' ``np.allclose``,
LiveCodeBench's ``Decimal`` lines) is not applied: an answer printed with other digits fails.
A call's arguments are a list (APPS, TACO) or one JSON value per line (LiveCodeBench, PRIME's
APPS); its result equals the expected value, or its only item when the dataset wraps it in a
list (APPS' call-based outputs); a ``class Solution`` in the starter code is instantiated. Values
go into the tests as Python literals of the parsed JSON: plain data only.

Task ids keep the row's own id where the layout has one (``family/id``), else the row number.
A row no adapter fits, or a field that does not parse, raises :class:`LayoutError` naming the
row and the field: the source loads whole or not at all.

Fields are data, never code: every name a row supplies that the tests call (``fn_name``,
``metadata.func_name``, a verifiable-coding case's ``fn_name``) must be a Python identifier that is
not a keyword (:func:`python_name`), or the row is refused naming the row and the field; values
reach the tests only as literals that round-trip.

LiveCodeBench's compressed ``private_test_cases`` are unpickled **without executing anything**:
the unpickler refuses every global (so no callable can be reached, let alone called) and the
result must be a string of JSON or plain lists and dicts; anything else is refused with the row
and field named. Every decoder is bounded in what it builds, not only in the bytes it reads: the
decompressed size (``MAX_DECODED``), and for each decoded field (:func:`bounded_value`) the values
it holds (``MAX_VALUES``, a value shared by reference counted each time it is reached: a few hundred
bytes of pickle can otherwise stand for gigabytes of tests), the characters of its strings
(``MAX_DECODED``) and its depth (``MAX_DEPTH``). A field over a bound, nested too deep for the
decoder, or not decoding at all is a :class:`LayoutError` naming the row and the field, never a
traceback.

KodCode's ``test`` is a pytest file, taken as it is (``kind = "python_pytest"``: the judge runs it
with pytest, fixtures, ``parametrize`` and ``pytest.raises`` included; the entry point is the first
name it takes from ``solution``).
"""

from __future__ import annotations

import ast
import base64
import binascii
import hashlib
import io
import json
import keyword
import pickle
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rollstream.errors import ConfigError
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec

MAX_DECODED = 64 << 20  # bytes of one decompressed test-case field; characters of one decoded field's strings
MAX_VALUES = 1 << 20  # values one decoded field holds, each counted every time it is reached
MAX_DEPTH = 100  # nesting of one decoded field (the tests hold it as a literal the parser must read back)
MAX_TESTS = 1000  # RewardSpec.tests' bound
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
PROGRAM_NOTE = ("Write a complete Python program that reads from standard input and writes to standard output. "
                "Return it in a ```python code block.")
FUNCTION_NOTE = "Return the complete code in a ```python code block."


class LayoutError(ConfigError):
    """A row of a published layout that cannot become a task (its row and field named)."""

    def __init__(self, row: int, field: str, problem: str) -> None:
        super().__init__(f"row {row}: field {field!r}: {problem}")
        self.row, self.field = row, field


@dataclass(frozen=True)
class Layout:
    name: str
    keys: frozenset[str]  # a row with all of these ...
    build: Callable[[Mapping[str, Any], str, int], TaskSpec]
    any_of: frozenset[str] = frozenset()  # ... and one of these (the same field under its published names) is this layout's

    def fits(self, keys: set[str]) -> bool:
        """``keys``: the row's fields that hold something (a loader fills a column a row lacks with None)."""
        return self.keys <= keys and (not self.any_of or bool(self.any_of & keys))

    def describe(self) -> str:
        return ", ".join([*sorted(self.keys), *([" | ".join(sorted(self.any_of))] if self.any_of else [])])


# --- helpers


def is_python_name(name: object) -> bool:
    """Whether ``name`` is a name the tests may call: an identifier, not a keyword."""
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def python_name(value: object, index: int, field: str) -> str:
    """``value``, a name a row supplies that the tests will call, when it is one (an identifier, not a
    keyword); else the row is refused: a name is pasted into code, so anything else would be code
    (``(lambda *a: 1) or f``, ``__import__('os').system(...)``)."""
    if not is_python_name(value):
        raise LayoutError(index, field, f"{_shown(value)} is not a Python identifier (a name the tests call; "
                                        "the row is refused, not repaired)")
    return value  # type: ignore[return-value]


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else f"a {type(value).__name__}, not text,"
    return text if len(text) <= 80 else text[:77] + "..."


def _tag(value: object) -> object:
    """A case's type tag as something a set can hold (a list or dict given as a tag is shown by its type)."""
    return value if isinstance(value, (str, type(None))) else f"<{type(value).__name__}>"


def bounded_value(value: Any, index: int, field: str) -> Any:
    """``value`` (what a decoder built for ``field``) when it is within the bounds: at most
    ``MAX_VALUES`` values and ``MAX_DECODED`` characters of strings (bytes, digits of integers),
    each counted every time it is reached, so a value shared by reference counts as often as the
    tests would repeat it; at most ``MAX_DEPTH`` levels deep. Walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    values, chars = 1, 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (str, bytes, bytearray)):
            chars += len(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            chars += item.bit_length() // 3
        elif isinstance(item, (list, tuple, set, frozenset, dict)):
            if depth > MAX_DEPTH:
                raise LayoutError(index, field, f"nested deeper than {MAX_DEPTH} levels")
            children = [x for pair in item.items() for x in pair] if isinstance(item, dict) else list(item)
            values += len(children)
            if values > MAX_VALUES:
                raise LayoutError(index, field, f"holds more than {MAX_VALUES} values (a value shared by reference "
                                                "counts each time it is reached)")
            stack.extend((child, depth + 1) for child in children)
        if chars > MAX_DECODED:
            raise LayoutError(index, field, f"holds more than {MAX_DECODED} characters (a value shared by "
                                            "reference counts each time it is reached)")
    return value


class _NotJSON(LayoutError):
    """Text that is not JSON at all (a caller may take it as a plain string); ``reason``: the decoder's."""

    def __init__(self, row: int, field: str, reason: str) -> None:
        super().__init__(row, field, f"not JSON ({reason})")
        self.reason = reason


def loads(text: str | bytes, index: int, field: str) -> Any:
    """``text`` decoded as JSON and bounded (:func:`bounded_value`); a LayoutError naming the row and
    the field when it is not JSON, nests deeper than the decoder can go, or is over a bound."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise LayoutError(index, field, f"JSON nested too deeply to read (at most {MAX_DEPTH} levels)") from None
    except MemoryError:
        raise LayoutError(index, field, "JSON too large to read") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer of too many digits
        raise _NotJSON(index, field, str(exc)) from None
    return bounded_value(value, index, field)


def _json(row: Mapping[str, Any], field: str, index: int) -> Any:
    """A field holding JSON (a string) or the value already parsed (a loader that decoded it)."""
    value = row.get(field)
    if isinstance(value, (str, bytes)) and not value.strip():
        raise LayoutError(index, field, f"empty: the row has no {field}; drop such rows before loading "
                                        f"(datasets: dataset.filter(lambda row: row[{field!r}]))")
    if isinstance(value, (str, bytes)):
        return loads(value, index, field)
    return bounded_value(value, index, field)


def _optional_text(row: Mapping[str, Any], field: str, index: int) -> str:
    value = row.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise LayoutError(index, field, f"expected text, not {type(value).__name__}")
    return value


def _text(row: Mapping[str, Any], field: str, index: int) -> str:
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        raise LayoutError(index, field, "missing or empty")
    return value


def _row_id(row: Mapping[str, Any], family: str, index: int, *fields: str) -> str:
    for field in fields:
        value = row.get(field)
        if value not in (None, ""):
            return f"{family}/{value}"
    return f"{family}/{index}"


def unfenced(text: str) -> str:
    """The code of a solution given fenced (```python ... ```) or as it is."""
    match = _FENCE.search(text)
    return match.group(1).strip("\n") + "\n" if match else text


def _literal(value: Any, index: int, field: str) -> str:
    """``value`` (parsed JSON) as a Python literal the tests can hold."""
    try:
        text = repr(value)
        if ast.literal_eval(text) != value:
            raise ValueError("does not round-trip")
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise LayoutError(index, field, f"a value that is not plain data ({exc})") from None
    return text


def _as_text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _program_tests(cases: Sequence[tuple[Any, Any]], index: int, field: str) -> list[str]:
    try:
        texts = [(_as_text(i), _as_text(o)) for i, o in cases]
    except ValueError as exc:  # an integer of more digits than str() writes
        raise LayoutError(index, field, f"a program's input or output that is not text ({exc})") from None
    return [f"assert run_program({_literal(i, index, field)}).split() == {_literal(o, index, field)}.split()"
            for i, o in texts]


def _lines_of_json(value: Any, index: int, field: str) -> list[Any]:
    """A call's arguments given as one JSON value per line (LiveCodeBench, PRIME's APPS)."""
    try:
        return bounded_value([loads(line, index, field) for line in str(value).splitlines() if line.strip()],
                             index, field)
    except _NotJSON as exc:
        raise LayoutError(index, field, f"a call's arguments that are not JSON lines "
                                        f"({exc.reason})") from None


def _call_tests(call: str, cases: Sequence[tuple[Any, Any]], index: int, field: str) -> list[str]:
    tests = []
    for args, expected in cases:
        if isinstance(args, str):  # one JSON value per line (the format PRIME's loaders write)
            args = _lines_of_json(args, index, field)
            if isinstance(expected, str):
                try:
                    expected = loads(expected, index, field)
                except _NotJSON:
                    pass  # a string result given as it is
        if not isinstance(args, list):
            raise LayoutError(index, field, f"a call's arguments must be a list, not {type(args).__name__}")
        got = f"{call}({', '.join(_literal(a, index, field) for a in args)})"
        want = _literal(expected, index, field)
        if isinstance(expected, list) and len(expected) == 1:  # APPS wraps a call's result in a list
            only = _literal(expected[0], index, field)
            tests.append(f"_result = {got}\nassert _result == {want} or _result == {only}")
        else:
            tests.append(f"assert {got} == {want}")
    return tests


def _bounded(tests: list[str], index: int, field: str) -> list[str]:
    if not tests:
        raise LayoutError(index, field, "no test cases")
    if len(tests) > MAX_TESTS:
        raise LayoutError(index, field, f"{len(tests)} test cases (at most {MAX_TESTS})")
    return tests


def _method_call(starter: str, name: str) -> str:
    """How the tests call ``name``: ``Solution().name`` when the starter code declares it in a class."""
    return f"Solution().{name}" if re.search(r"^\s*class\s+Solution\b", starter or "", re.M) else name


def _function_spec(starter: str, name: str, tests: list[str]) -> RewardSpec:
    entry = "Solution" if _method_call(starter, name) != name else name
    return RewardSpec(entry_point=entry, tests=tests, timeout_s=10.0)


def _prompt(question: str, starter: str, program: bool) -> str:
    if program:
        return f"{question.rstrip()}\n\n{PROGRAM_NOTE}"
    starter_part = f"\n\nStart from:\n```python\n{starter.rstrip()}\n```" if starter and starter.strip() else ""
    return f"{question.rstrip()}{starter_part}\n\n{FUNCTION_NOTE}"


# --- the layouts


def _taco(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    io_spec = _json(row, "input_output", index)
    if not isinstance(io_spec, dict) or not isinstance(io_spec.get("inputs"), list) \
            or not isinstance(io_spec.get("outputs"), list):
        raise LayoutError(index, "input_output", "expected JSON with lists 'inputs' and 'outputs'")
    cases = list(zip(io_spec["inputs"], io_spec["outputs"], strict=False))
    if len(io_spec["inputs"]) != len(io_spec["outputs"]):
        raise LayoutError(index, "input_output", f"{len(io_spec['inputs'])} inputs, {len(io_spec['outputs'])} outputs")
    starter = _optional_text(row, "starter_code", index)
    fn_name = io_spec.get("fn_name")
    if fn_name not in (None, ""):
        fn_name = python_name(fn_name, index, "input_output.fn_name")
    solutions = _json(row, "solutions", index) if row.get("solutions") else []
    if not isinstance(solutions, list):
        raise LayoutError(index, "solutions", "expected a JSON list of programs")
    reference = unfenced(solutions[0]) if solutions and isinstance(solutions[0], str) else None
    question = _text(row, "question", index)
    if fn_name:
        tests = _bounded(_call_tests(_method_call(starter, fn_name), cases, index, "input_output"), index,
                         "input_output")
        reward = _function_spec(starter, fn_name, tests)
    else:
        reward = RewardSpec(program=True, tests=_bounded(_program_tests(cases, index, "input_output"), index,
                                                          "input_output"), timeout_s=10.0)
    return TaskSpec(task_id=_row_id(row, family, index, "problem_id", "id", "task_id"), family=family,
                    prompt=_prompt(question, starter, not fn_name), reward=reward, reference_solution=reference)


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every global: nothing but plain data (str, numbers, lists, dicts, ...) can come out,
    and no callable can be reached."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: it names {module}.{name} (only plain data is read)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: a persistent id (only plain data is read)")


def decode_test_cases(value: Any, index: int, field: str) -> list[Any]:
    """LiveCodeBench's test cases: a JSON list, or base64 of zlib of a pickle of its JSON string."""
    if isinstance(value, list):
        return bounded_value(value, index, field)
    if not isinstance(value, str) or not value.strip():
        raise LayoutError(index, field, "missing or empty")
    text = value.strip()
    if text[:1] not in "[{":
        try:
            packed = base64.b64decode(text, validate=True)
            inflater = zlib.decompressobj()
            raw = inflater.decompress(packed, MAX_DECODED)
            if inflater.unconsumed_tail:
                raise LayoutError(index, field, f"decompresses to more than {MAX_DECODED} bytes")
            decoded = _PlainUnpickler(io.BytesIO(raw)).load()
        except LayoutError:
            raise
        except (binascii.Error, zlib.error, pickle.UnpicklingError, EOFError, ValueError, TypeError,
                IndexError, KeyError, AttributeError, MemoryError, RecursionError) as exc:
            raise LayoutError(index, field, f"not plain data: {exc}") from None
        if isinstance(decoded, bytes):
            decoded = decoded.decode("utf-8", "replace")
        if isinstance(decoded, list):
            return bounded_value(decoded, index, field)  # shared references: counted each time reached
        if not isinstance(decoded, str):
            raise LayoutError(index, field, f"not plain data: the payload is a {type(decoded).__name__}")
        text = decoded
    cases = loads(text, index, field)
    if not isinstance(cases, list):
        raise LayoutError(index, field, "expected a list of test cases")
    return cases


def _livecodebench(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    cases = [*decode_test_cases(row.get("public_test_cases"), index, "public_test_cases")]
    if row.get("private_test_cases"):
        cases += decode_test_cases(row["private_test_cases"], index, "private_test_cases")
    kinds = {_tag(c.get("testtype")) if isinstance(c, dict) else None for c in cases}
    if not kinds <= {"stdin", "functional"} or len(kinds) != 1:
        raise LayoutError(index, "public_test_cases", f"test types {sorted(map(str, kinds))}: expected all 'stdin' "
                                                      "or all 'functional'")
    starter = _optional_text(row, "starter_code", index)
    question = _text(row, "question_content", index)
    if kinds == {"stdin"}:
        if not all("input" in c and "output" in c for c in cases):
            raise LayoutError(index, "public_test_cases", "a stdin case without 'input' and 'output'")
        reward = RewardSpec(program=True, tests=_bounded(_program_tests(
            [(c["input"], c["output"]) for c in cases], index, "public_test_cases"), index, "public_test_cases"),
            timeout_s=10.0)
        program = True
    else:
        metadata = _json(row, "metadata", index) or {}
        name = metadata.get("func_name") if isinstance(metadata, dict) else None
        if not name:
            raise LayoutError(index, "metadata", "functional tests need metadata.func_name")
        name = python_name(name, index, "metadata.func_name")
        calls = []
        for case in cases:
            try:  # one JSON value per line: the call's arguments; the output is one JSON value
                args = _lines_of_json(case["input"], index, "public_test_cases")
                expected = loads(case["output"], index, "public_test_cases")
            except _NotJSON as exc:
                raise LayoutError(index, "public_test_cases", f"a functional case that is not JSON "
                                                              f"({exc.reason})") from None
            except (KeyError, TypeError) as exc:
                raise LayoutError(index, "public_test_cases", f"a functional case whose input and output are not JSON text "
                                                              f"({type(exc).__name__}: {exc})") from None
            calls.append((args, expected))
        reward = _function_spec(starter, name, _bounded(_call_tests(_method_call(starter, name), calls, index,
                                                                    "public_test_cases"), index, "public_test_cases"))
        program = False
    return TaskSpec(task_id=_row_id(row, family, index, "question_id"), family=family,
                    prompt=_prompt(question, starter, program), reward=reward)


def _open_r1(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    info = _json(row, "verification_info", index)
    if not isinstance(info, dict) or not isinstance(info.get("test_cases"), list):
        raise LayoutError(index, "verification_info", "expected JSON with a list 'test_cases'")
    language = str(info.get("language", "python")).lower()
    if not language.startswith("python"):
        raise LayoutError(index, "verification_info", f"language {language!r}: only python runs here")
    cases = info["test_cases"]
    if not all(isinstance(c, dict) for c in cases):
        raise LayoutError(index, "verification_info", "test cases must be objects with input and output")
    kinds = {_tag(c.get("type", "stdin_stdout")) for c in cases}
    names = {_tag(c.get("fn_name")) for c in cases}
    field = "verification_info"
    if kinds == {"function_call"} and len(names) == 1 and None not in names:
        name = python_name(cases[0].get("fn_name"), index, "verification_info.test_cases.fn_name")
        reward = RewardSpec(entry_point=name, timeout_s=10.0, tests=_bounded(_call_tests(
            name, [(c.get("input"), c.get("output")) for c in cases], index, field), index, field))
    elif kinds == {"stdin_stdout"}:
        reward = RewardSpec(program=True, timeout_s=10.0, tests=_bounded(_program_tests(
            [(c.get("input", ""), c.get("output", "")) for c in cases], index, field), index, field))
    else:
        raise LayoutError(index, field, f"test case types {sorted(map(str, kinds))}: expected all stdin_stdout, or "
                                        "all function_call of one fn_name")
    prompt_field = next((f for f in ("prompt", "problem_statement", "problem") if row.get(f)), "prompt")
    solution = row.get("gold_standard_solution")
    return TaskSpec(task_id=_row_id(row, family, index, "problem_id", "in_source_id"), family=family,
                    prompt=_text(row, prompt_field, index), reward=reward,
                    reference_solution=unfenced(solution) if isinstance(solution, str) and solution.strip() else None)


# The function an assert calls first (``assert f(...)``, ``assert not (f(...))``): a task's entry
# point read from its tests (MBPP rows in sources.py, AceCode rows here).
ASSERTED_CALL = re.compile(r"assert\s+(?:not\b\s*)?\(?\s*(\w+)\s*\(")


def asserted_call(tests: Sequence[object]) -> str:
    """The first name an assert of ``tests`` calls that is a Python name ("" when none is)."""
    return next((m.group(1) for t in tests if isinstance(t, str) for m in ASSERTED_CALL.finditer(t)
                 if is_python_name(m.group(1))), "")


def _acecode(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    tests = row.get("test_cases")
    if isinstance(tests, str):
        tests = _json(row, "test_cases", index)
    if not isinstance(tests, list) or not all(isinstance(t, str) and t.strip() for t in tests):
        raise LayoutError(index, "test_cases", "expected a list of assert statements")
    for test in tests:
        try:
            ast.parse(test)
        except SyntaxError as exc:
            raise LayoutError(index, "test_cases", f"a test that does not parse: {test[:80]!r} ({exc.msg})") from None
    return TaskSpec(task_id=_row_id(row, family, index, "id"), family=family,
                    prompt=_prompt(_text(row, "question", index), "", False),
                    reward=RewardSpec(entry_point=asserted_call(tests), tests=_bounded(tests, index, "test_cases")))


def pytest_entry_point(source: str, index: int, field: str = "test") -> str:
    """The name a pytest file tests (the first it takes from ``solution``: ``from solution import
    add`` or ``solution.add``); the file is refused when it does not parse, has no test function
    or class, or takes nothing from the solution."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise LayoutError(index, field, f"does not parse ({exc.msg}, line {exc.lineno})") from None
    if not any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")
               or isinstance(node, ast.ClassDef) and node.name.startswith("Test") for node in tree.body):
        raise LayoutError(index, field, "no test functions or classes")
    aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name == "solution"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "solution" and not node.level:
            names = [a.name for a in node.names if a.name != "*"]
            if names:
                return names[0]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            return node.attr
    raise LayoutError(index, field, "takes nothing from solution (from solution import ...)")


def _kodcode(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    field = "test" if "test" in row else "test_code"  # test_code: KodCode's earlier revision
    source = _text(row, field, index)
    entry = pytest_entry_point(source, index, field)
    solution = row.get("solution")
    return TaskSpec(task_id=_row_id(row, family, index, "question_id", "conversation_id"), family=family,
                    prompt=_prompt(_text(row, "question", index), "", False),
                    reward=RewardSpec(kind="python_pytest", entry_point=entry, tests=_bounded([source], index, field),
                                      timeout_s=10.0),
                    reference_solution=unfenced(solution) if isinstance(solution, str) and solution.strip() else None)


LAYOUTS: tuple[Layout, ...] = (
    Layout("taco", frozenset({"question", "input_output"}), _taco),
    Layout("livecodebench", frozenset({"question_content", "public_test_cases"}), _livecodebench),
    Layout("open-r1", frozenset({"verification_info"}), _open_r1, frozenset({"prompt", "problem_statement", "problem"})),
    Layout("kodcode", frozenset({"question", "solution"}), _kodcode, frozenset({"test", "test_code"})),
    Layout("acecode", frozenset({"question", "test_cases"}), _acecode),
)


def layout_of(row: Mapping[str, Any]) -> Layout | None:
    """The published layout ``row`` is in (None: none of these)."""
    keys = {k for k, v in row.items() if v is not None}
    return next((layout for layout in LAYOUTS if layout.fits(keys)), None)


def published_task(row: Mapping[str, Any], family: str, index: int) -> TaskSpec | None:
    """``row`` as a TaskSpec when it is in a published layout (None otherwise); LayoutError when it is
    one but a field does not parse."""
    layout = layout_of(row)
    if layout is None:
        return None
    task = layout.build(row, family, index)
    try:  # a Struct built in code is not checked against its bounds: check them here, not downstream
        return msgspec.convert(msgspec.to_builtins(task), TaskSpec)
    except msgspec.ValidationError as exc:
        raise LayoutError(index, layout.name, f"the task it makes is invalid ({exc})") from None


# --- math answers (kind ``math_answer``): the gold read from the row, the solution the reference

BOXED_NOTE = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_NOTE = "Put the letter of the correct choice within \\boxed{} (one capital letter)."
# A choice's letter where the completion boxed it: \boxed{B}, \boxed{(B)}, \boxed{\text{B}}, \boxed{B.}; any
# other box is no answer of this kind (the pool compares the letter it finds with the gold letter).
CHOICE_PATTERN = (r"\\boxed\s*\{\s*(?:\\text(?:bf|rm)?\s*\{\s*)?\(?\s*(?P<answer>[A-Z])\s*\)?\s*\.?\s*\}?\s*\}")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_GOLD = 2000  # characters of a gold answer the executor reads (its answers.MAX_ANSWER_CHARS); longer: flagged
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*(\{)?")
_GROUPING = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def last_boxed(text: str) -> str | None:
    """The content of the last outermost ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text`` whose braces
    balance (``\\{`` and ``\\}`` are literal braces), or of a last ``\\boxed 5`` written without braces (to
    the next space or ``$``); None when there is none. One pass: linear in ``text``."""
    starts: dict[int, int] = {}  # a box's "{" -> where its content starts
    bare: dict[int, str] = {}  # where a box without braces starts -> its content
    for match in _BOX_START.finditer(text):
        if match.group(1) is not None:
            starts[match.end() - 1] = match.end()
        elif rest := re.match(r"[^\s$]+", text[match.end():match.end() + MAX_GOLD]):
            bare[match.start()] = rest.group(0)
    found: tuple[int, str] | None = None  # (where it ends, its content)
    stack: list[int | None] = []
    open_box: int | None = None  # the stack depth of the box being read
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i in bare and open_box is None:
                found = (i, bare[i])
            i += 2 if text[i + 1:i + 2] in ("{", "}") else 1
            continue
        if c == "{":
            if i in starts and open_box is None:
                open_box = len(stack)
                stack.append(starts[i])
            else:
                stack.append(None)
        elif c == "}" and stack:
            begin = stack.pop()
            if begin is not None and open_box == len(stack):
                found, open_box = (i, text[begin:i]), None
        i += 1
    return found[1].strip() if found is not None else None


def _gold_text(value: Any, index: int, field: str) -> str:
    """A gold answer given as text or a number, as text without ``$`` around it or a ``\\boxed{}`` wrapper."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise LayoutError(index, field, f"expected the answer as text or a number, not {type(value).__name__}")
    try:
        text = str(value).strip()
    except ValueError as exc:  # an integer of more digits than str() writes
        raise LayoutError(index, field, f"an answer that is not text ({exc})") from None
    if text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    whole = re.fullmatch(r"\\(?:boxed|fbox)\s*\{(.*)\}", text, re.DOTALL)
    if whole and last_boxed(text) == whole.group(1).strip():  # one box around the whole answer
        text = whole.group(1).strip()
    if not text:
        raise LayoutError(index, field, "empty: the row has no answer")
    return text


def gsm8k_gold(answer: str, index: int, field: str = "answer") -> str:
    """What follows the last ``####`` of a GSM8K answer, digit grouping commas dropped (``1,234``: 1234)."""
    gold = answer.rsplit("####", 1)[1].strip()
    if not gold:
        raise LayoutError(index, field, "nothing after its last '####' (GSM8K's final answer)")
    return gold.replace(",", "") if _GROUPING.fullmatch(gold) else gold


def _slug(value: Any) -> str:
    """A row's subject, category or source as a family suffix (``Intermediate Algebra``: intermediate_algebra)."""
    if not isinstance(value, str):
        return ""
    return re.sub(r"[^a-z0-9]+", "_", value.strip().lower()).strip("_")[:64]


def _math_family(row: Mapping[str, Any], family: str, *fields: str) -> str:
    """``family/subject`` by the first of ``fields`` the row fills (MATH's ``type``, MMLU's ``subject``,
    NuminaMath's ``source``, ...), else the dataset's own family."""
    for field in fields:
        slug = _slug(row.get(field))
        if slug:
            return f"{family}/{slug}"
    return family


def _math_id(row: Mapping[str, Any], family: str, text: str, *fields: str) -> str:
    """``family/id`` from the row's own id, else ``family/h`` + a hash of the problem's text (stable across
    row orders; a repeated problem's repeats get ``-2``, ``-3``... in the source's order: sources.hf_tasks)."""
    for field in fields:
        value = row.get(field)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return f"{family}/{str(value).strip()}"[:256]
    return f"{family}/h{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def _level(row: Mapping[str, Any]) -> int:
    """MATH's ``Level 3`` (or a number) as the task's difficulty (1 when the row has none or ``Level ?``)."""
    level = row.get("level")
    if isinstance(level, int) and not isinstance(level, bool):
        return min(max(level, 0), 10)
    match = re.fullmatch(r"\s*(?:level\s*)?(\d{1,2})\s*", level, re.IGNORECASE) if isinstance(level, str) else None
    return min(int(match.group(1)), 10) if match else 1


def _math_spec(gold: str, **kw: Any) -> RewardSpec:
    return RewardSpec(kind="math_answer", answer=gold, **kw)


MATH_IDS = ("unique_id", "uuid", "id", "problem_id", "idx", "index")


def _gsm8k(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    """GSM8K (``question``, ``answer``: a solution ending ``#### n``); also any question with a one-line
    ``answer`` (Big-Math's, DeepScaleR's when they name the problem ``question``)."""
    question = _text(row, "question", index)
    answer = _gold_text(row.get("answer"), index, "answer")
    if "####" in answer:
        gold, reference = gsm8k_gold(answer, index), answer
    elif "\n" in answer.strip():
        raise LayoutError(index, "answer", "a solution without GSM8K's final '#### n' line, and not a one-line answer")
    else:
        gold, reference = answer, None
    return TaskSpec(task_id=_math_id(row, family, question, *MATH_IDS), family=_math_family(row, family, "source"),
                    prompt=f"{question.rstrip()}\n\n{BOXED_NOTE}", reward=_math_spec(gold),
                    reference_solution=reference)


def _problem(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    """MATH / hendrycks (``problem``, ``solution`` with ``\\boxed{}``, ``level``, ``type``), MATH-500
    (``answer``, ``subject``, ``unique_id``), NuminaMath and OpenR1-Math (``problem``, ``solution``,
    ``answer``, ``source``), DeepScaleR and Big-Math (``problem``, ``answer``): the gold is ``answer`` when
    the row fills it, else the solution's last ``\\boxed{}``; the solution is the reference."""
    problem = _text(row, "problem", index)
    solution = _optional_text(row, "solution", index)
    if row.get("answer") not in (None, ""):
        gold = _gold_text(row.get("answer"), index, "answer")
    elif solution.strip():
        boxed = last_boxed(solution)
        if not boxed:
            raise LayoutError(index, "solution", "no \\boxed{...} answer in it (and no 'answer' field)")
        gold = boxed
    else:
        raise LayoutError(index, "answer", "missing or empty (and no 'solution' with a \\boxed{} answer)")
    return TaskSpec(task_id=_math_id(row, family, problem, *MATH_IDS),
                    family=_math_family(row, family, "type", "subject", "problem_type", "source"),
                    prompt=f"{problem.rstrip()}\n\n{BOXED_NOTE}", reward=_math_spec(gold),
                    reference_solution=solution if solution.strip() else None, difficulty=_level(row))


def _choices(row: Mapping[str, Any], index: int) -> tuple[str, list[str], list[str]]:
    """(the field, the choices' texts, their labels as published: letters, digits or empty)."""
    field = "choices" if row.get("choices") is not None else "options"
    value = row.get(field)
    if isinstance(value, str):
        value = _json(row, field, index)
    if isinstance(value, dict):  # ARC, CommonsenseQA: {"label": [...], "text": [...]}
        texts, labels = value.get("text"), value.get("label")
        if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
            raise LayoutError(index, field, "expected lists 'text' and 'label' of one length")
    elif isinstance(value, list):
        texts, labels = value, [""] * len(value)
    else:
        raise LayoutError(index, field, f"expected a list of choices or {{label, text}}, not {type(value).__name__}")
    if not 2 <= len(texts) <= len(LETTERS):
        raise LayoutError(index, field, f"{len(texts)} choices (2 to {len(LETTERS)})")
    if not all(isinstance(t, (str, int, float)) and not isinstance(t, bool) and str(t).strip() for t in texts):
        raise LayoutError(index, field, "a choice that is empty or not text")
    texts = [str(t).strip() for t in texts]
    if field == "options" and all(re.match(rf"{LETTERS[i]}\s*[).:]", t) for i, t in enumerate(texts)):
        texts = [re.sub(r"^[A-Z]\s*[).:]\s*", "", t) for t in texts]  # AQuA's "A)21": lettered already
    return field, texts, [str(label).strip() for label in labels]


def _choice_index(row: Mapping[str, Any], texts: list[str], labels: list[str], index: int) -> tuple[str, int]:
    """(the field, the index of the right choice): a letter, a label, a 0-based index or the choice's text."""
    field = next((f for f in ("answer", "answerKey", "correct", "answer_index") if row.get(f) not in (None, "")),
                 "answer")
    value = row.get(field)
    if isinstance(value, int) and not isinstance(value, bool):
        position = value
    elif isinstance(value, str) and value.strip():
        said = value.strip()
        if said in labels and any(labels):
            position = labels.index(said)
        elif len(said) == 1 and said.upper() in LETTERS:
            position = LETTERS.index(said.upper())
        elif said.isdigit():
            position = int(said)
        elif texts.count(said) == 1:
            position = texts.index(said)
        else:
            raise LayoutError(index, field, f"{_shown(said)} is no choice's letter, label, index or text")
    else:
        raise LayoutError(index, field, "missing: the right choice's letter or index")
    if not 0 <= position < len(texts):
        raise LayoutError(index, field, f"choice {position} of {len(texts)} (a 0-based index)")
    return field, position


def _multiple_choice(row: Mapping[str, Any], family: str, index: int) -> TaskSpec:
    """A question with lettered choices (MMLU: ``choices`` and an index; ARC, CommonsenseQA: ``choices``
    with ``label``/``text`` and ``answerKey``; MMLU-Pro, AQuA: ``options`` and a letter): the prompt lists
    the choices as A., B., ...; the gold is the right one's letter, read from the completion's ``\\boxed{}``."""
    question = _text(row, "question", index)
    _, texts, labels = _choices(row, index)
    _, position = _choice_index(row, texts, labels, index)
    listed = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(texts))
    return TaskSpec(task_id=_math_id(row, family, f"{question}\n{listed}", *MATH_IDS, "question_id"),
                    family=_math_family(row, family, "subject", "category"),
                    prompt=f"{question.rstrip()}\n\n{listed}\n\n{CHOICE_NOTE}",
                    reward=_math_spec(LETTERS[position], answer_format="regex", answer_pattern=CHOICE_PATTERN))


# Read after the code layouts (a code row has its tests; these have an answer): LAYOUTS' tail.
MATH_LAYOUTS: tuple[Layout, ...] = (
    Layout("multiple-choice", frozenset({"question"}), _multiple_choice, frozenset({"choices", "options"})),
    Layout("gsm8k", frozenset({"question", "answer"}), _gsm8k),
    Layout("math", frozenset({"problem"}), _problem, frozenset({"answer", "solution"})),
)
LAYOUTS = (*LAYOUTS, *MATH_LAYOUTS)


def math_layout_of(row: Mapping[str, Any]) -> Layout | None:
    """The math layout ``row`` is in when it is in no code layout (None otherwise)."""
    layout = layout_of(row)
    return layout if layout in MATH_LAYOUTS else None
