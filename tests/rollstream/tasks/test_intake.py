"""Task intake without the sandbox: duplicate clusters, contamination, personal data and secrets,
mutants and the inputs that tell them apart, and what the sampler does with the report."""

from __future__ import annotations

import ast

import msgspec
import pytest

from rollstream.config import IntakeConfig
from rollstream.schemas.events import RewardSpec
from rollstream.schemas.tasks import TaskSpec
from rollstream.tasks import mutants, pii
from rollstream.tasks.contamination import EvalIndex
from rollstream.tasks.dedup import duplicate_clusters, normalised_code
from rollstream.tasks.intake import (
    IntakeReport,
    TaskCheck,
    apply_intake,
    completion_parameters,
    digest,
    load_report,
    personal_data,
    reasons_of,
    save_report,
    static_checks,
)
from rollstream.tasks.sources import builtin_tasks, humaneval_tasks

pytestmark = pytest.mark.unit

# one of each kind, as a person or a leaked config would write them
SAMPLES = {
    "EMAIL": "jane.roe@acme-mail.com",
    "PHONE": "+1 (415) 555-2671",
    "IP_ADDRESS": "8.8.4.4",
    "CREDIT_CARD": "4111 1111 1111 1111",
    "SECRET": "AKIAIOSFODNN7EXAMPLE",
}
SECRETS = [
    "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "xoxb-123456789012-abcdefghijkl",
    "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx\n-----END RSA PRIVATE KEY-----",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.c2lnbmF0dXJl",
]


def task(task_id: str, prompt: str, reference: str, tests: list[str] | None = None, family: str = "f") -> TaskSpec:
    name = ast.parse(reference).body[0].name  # type: ignore[attr-defined]
    return TaskSpec(task_id=task_id, family=family, prompt=prompt, reference_solution=reference,
                    reward=RewardSpec(entry_point=name, tests=tests or [f"assert {name}(1) is not None"]))


def test_a_duplicate_and_a_near_duplicate_are_clustered() -> None:
    tasks = [
        task("f/double", "Write a function double(n) that returns twice n.", "def double(n):\n    return n * 2\n"),
        # the same reference with other names and a docstring: an exact duplicate
        task("f/twice", "Write twice(x), x multiplied by two.", 'def twice(x):\n    """Twice."""\n    return x * 2\n'),
        # nearly the same prompt and a different body: a near duplicate
        task("f/count_vowels", "Write a function count_vowels(s) that returns how many vowels (a, e, i, o, u) the "
             "string s contains, ignoring case, so count_vowels('Hello') is 2.",
             "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())\n"),
        task("f/count_vowels2", "Write a function count_vowels(s) that returns how many vowels (a, e, i, o, u) the "
             "string s contains, ignoring case, so count_vowels('Banana') is 3.",
             "def count_vowels(s):\n    n = 0\n    for c in s.lower():\n        n += c in 'aeiou'\n    return n\n"),
        task("f/unrelated", "Write a function parse_port(s) that parses a TCP port.",
             "def parse_port(s):\n    p = int(s)\n    if not 0 < p < 65536:\n        raise ValueError(s)\n    return p\n"),
    ]
    assert normalised_code(tasks[0].reference_solution) == normalised_code(tasks[1].reference_solution)
    clusters = {tuple(c.members): c for c in duplicate_clusters(tasks)}
    assert set(clusters) == {("f/double", "f/twice"), ("f/count_vowels", "f/count_vowels2")}
    assert clusters[("f/double", "f/twice")].kind == "exact"
    near = clusters[("f/count_vowels", "f/count_vowels2")]
    assert near.kind == "near" and near.pairs[0][2] == "prompt" and 0.7 <= near.pairs[0][3] < 1.0


def test_a_training_task_copied_from_humaneval_is_contaminated_with_its_spans() -> None:
    humaneval = humaneval_tasks()
    original = next(t for t in humaneval if t.task_id == "HumanEval/12")
    copied = msgspec.structs.replace(original, task_id="mine/longest", family="mine",
                                     prompt="Here is a small exercise for you.\n" + (original.prompt or ""))
    suite = builtin_tasks()
    index = EvalIndex([*suite, copied], humaneval)
    overlaps = index.overlaps(copied)
    assert overlaps and {o.eval_task for o in overlaps} == {"HumanEval/12"}
    assert {o.field for o in overlaps} == {"prompt", "tests", "reference"} and min(o.share for o in overlaps) > 0.5
    assert any("def longest(strings: List[str])" in span for o in overlaps for span in o.spans)
    # the built-in suite shares its prompt template and small idioms with HumanEval, nothing more
    assert [t.task_id for t in suite if index.overlaps(t)] == []


def test_a_verbatim_copy_of_a_small_humaneval_task_is_contaminated_whatever_its_length() -> None:
    """A copy of HumanEval's smallest tasks (prompt and solution) has too few tokens for the
    13-gram rule; an equal reference or prompt is contamination anyway (issue 40). An honest task
    of one's own with the same one-line body, name and idea is not."""
    humaneval = {t.task_id: t for t in humaneval_tasks()}
    suite = builtin_tasks()
    copies, honest = [], []  # (copy, the task it copies)
    for source_id, name in (("HumanEval/23", "strlen"), ("HumanEval/53", "add")):
        original = humaneval[source_id]
        copies.append((msgspec.structs.replace(original, task_id=f"mine/{name}", family="mine"), source_id))
        # only the reference copied, the prompt written anew
        copies.append((msgspec.structs.replace(original, task_id=f"mine/{name}_ref", family="mine",
                                               prompt=f"Please implement {name} as documented below."), source_id))
    honest.append(task("mine/strlen_own", "Write strlen(s) that returns how many characters the string s has.",
                       "def strlen(s):\n    return len(s)\n"))
    honest.append(task("mine/add_own", "Write add(x, y) returning the sum of two integers.",
                       "def add(x: int, y: int):\n    return x + y\n"))
    index = EvalIndex([*suite, *(c for c, _ in copies), *honest], list(humaneval.values()))
    for copy, source_id in copies:
        overlaps = index.overlaps(copy)
        assert {o.eval_task for o in overlaps} == {source_id}, (copy.task_id, overlaps)
        assert any(o.field == "reference" and o.share == 1.0 for o in overlaps), overlaps
    assert any(o.field == "prompt" and o.share == 1.0 for o in index.overlaps(copies[0][0]))
    assert [t.task_id for t in honest if index.overlaps(t)] == []
    assert [t.task_id for t in suite if index.overlaps(t)] == []


def test_each_kind_of_personal_data_and_secret_is_found_in_a_prompt() -> None:
    for kind, value in SAMPLES.items():
        found = personal_data(TaskSpec(task_id="p/x", prompt=f"Write f(). Contact: {value} for questions.",
                                       reward=RewardSpec(entry_point="f", tests=["assert f() == 1"])))
        assert [(f.where, f.kind, f.text) for f in found] == [("prompt", kind, value)], kind
    for secret in SECRETS:
        assert [f.kind for f in pii.find(f"config = '{secret}'")] == ["SECRET"], secret


def test_scrubbing_replaces_each_kind_and_keeps_the_task_s_own_text() -> None:
    text = "\n".join(f"{kind.lower()}: {value}" for kind, value in SAMPLES.items()) + "\nparsed 93.184.216.34"
    scrubbed = pii.scrub(text + "\n" + "\n".join(SECRETS), exempt=["assert parse('93.184.216.34') == 4"])
    for kind, value in SAMPLES.items():
        assert value not in scrubbed.text and f"{kind.lower()}: <{kind}>" in scrubbed.text
    assert "93.184.216.34" in scrubbed.text  # it came from the task's tests
    assert all(secret.splitlines()[0] not in scrubbed.text for secret in SECRETS)
    assert scrubbed.counts == {"EMAIL": 1, "PHONE": 1, "IP_ADDRESS": 1, "CREDIT_CARD": 1, "SECRET": 1 + len(SECRETS)}


def test_ordinary_output_is_not_personal_data() -> None:
    clean = ("Traceback (most recent call last):\n  File \"<completion>\", line 12, in f\nValueError: 12345678\n"
             "192.168.0.1 10.0.0.255 0.0.0.0 255.255.255.255 127.0.0.1\n2020-06-04 1234 5678 [1, 2, 3] 3.14159\n"
             "user@localhost total=4242 id=a1b2c3d4")
    assert pii.find(clean) == [] and pii.scrub(clean).text == clean
    assert not pii.maybe_sensitive("ok\nresult = [1, 2, 3]\n")
    # the suite's parsing tasks print private and special addresses: none of it is anyone's
    assert [t.task_id for t in builtin_tasks() if personal_data(t)] == []


def test_code_punctuation_is_not_a_phone_number_s_grouping() -> None:
    """The parenthesis of a call or a tuple around one long digit literal leaves it one group (issue
    40); a number grouped as people write them, or in international form, is still found."""
    for code in ("assert f(4155552671) == 1", "x = add(4155552671, 1)", "print(12025550143)", "f((4155552671))",
                 "n = [4155552671]"):
        assert [f for f in pii.find(code) if f.kind == "PHONE"] == [], code
    for text, value in (("call (415) 555-2671 now", "(415) 555-2671"), ("dial +14155552671", "+14155552671"),
                        ("tel: 415.555.2671", "415.555.2671"), ("f('(415)555-2671')", "(415)555-2671")):
        assert [(f.kind, f.text) for f in pii.find(text)] == [("PHONE", value)], text


def test_a_dotted_version_string_is_not_an_address() -> None:
    """Four-part versions (after v, a version operator or a version word, with a pre-release
    suffix, or as part of a longer dotted run) are not addresses (issue 40); a routable address
    in ordinary code, next to a version or on its own, is still found."""
    for code in ('__version__ = "1.2.3.4"', "pkg==1.2.3.4", 'parse_version("1.10.2.3")', "release 2.0.1.3-beta",
                 "v1.2.3.4", 'v = "5.6.7.8.9"', '{"version": "4.3.2.1"}', "requires >= 3.2.1.4", "2.0.1.3rc1"):
        assert [f for f in pii.find(code) if f.kind == "IP_ADDRESS"] == [], code
    for text, values in (('host = "8.8.8.8"', ["8.8.8.8"]), ("version check then host=9.9.9.9", ["9.9.9.9"]),
                         ('__version__ = "1.2.3.4"; dns = "8.8.4.4"', ["8.8.4.4"]),
                         ("<td>93.184.216.34</td>", ["93.184.216.34"])):
        assert [f.text for f in pii.find(text) if f.kind == "IP_ADDRESS"] == values, text


def test_mutants_cover_every_operator_and_are_distinct_programs() -> None:
    reference = ("def f(nums, k):\n    \"\"\"Doc.\"\"\"\n    total = 0\n    for n in nums:\n"
                 "        if n > k and not n % 2 == 1:\n            total += n * 2\n    return total\n")
    found = mutants.all_mutants(reference)
    assert {m.operator for m in found} == set(mutants.OPERATORS)
    sources = [m.source for m in found]
    assert len(sources) == len(set(sources)) and all(compile(s, "<m>", "exec") for s in sources)
    assert all('"""Doc."""' in s or "Doc" in s for s in sources)  # the docstring is never mutated
    changes = {m.change for m in found}
    assert {"> -> >=", "and -> or", "removed not", "0 -> 1", "* -> //", "return None"} <= changes
    assert any(c.startswith("removed: total += n * 2") for c in changes)
    few, total = mutants.mutants(reference, 6)
    assert total == len(found) and len(few) == 6 and len({m.operator for m in few}) == 6


def test_survivors_are_told_apart_on_inputs_varied_from_the_tests() -> None:
    tests = ["assert clamp(5, 0, 10) == 5", "assert clamp(-1, 0, 10) == 0", "assert clamp(x=3, low=1, high=2) == 2"]
    calls = mutants.call_arguments(tests, "clamp")
    assert calls == [((5, 0, 10), {}), ((-1, 0, 10), {}), ((), {"x": 3, "low": 1, "high": 2})]
    varied = mutants.varied_arguments(calls, limit=24)
    assert varied[:3] == calls and len(varied) == 24 and len(set(map(repr, varied))) == 24
    assert ((6, 0, 10), {}) in varied
    checks = mutants.equivalence_tests("clamp", varied[:2])
    setup = mutants.renamed_reference("def clamp(x, low, high):\n    return max(low, min(x, high))\n")
    namespace: dict = {}
    exec(setup, namespace)  # noqa: S102 - our own literal
    exec("def clamp(x, low, high):\n    return min(high, max(x, low))\n", namespace)  # noqa: S102 - equivalent
    for check in checks:
        exec(check, dict(namespace))  # noqa: S102 - passes: they agree
    exec("def clamp(x, low, high):\n    return max(low, min(x, high + 1))\n", namespace)  # noqa: S102
    with pytest.raises(AssertionError):
        exec(mutants.equivalence_tests("clamp", [((11, 0, 10), {})])[0], dict(namespace))  # noqa: S102


def test_the_sampler_quarantines_failing_and_unchecked_tasks_only_when_enforced(tmp_path) -> None:
    good, weak, new = builtin_tasks()[:3]
    passing = TaskCheck(task_id=good.task_id, family=good.family, digest=digest(good), reference_passes=True,
                        mutation_score=0.9)
    failing = TaskCheck(task_id=weak.task_id, family=weak.family, digest=digest(weak), reference_passes=True,
                        mutation_score=0.5, wrong_passing=[0])
    path = tmp_path / "intake.json"
    save_report(path, [passing, failing], [])
    report = load_report(path)
    assert isinstance(report, IntakeReport) and set(report.tasks) == {digest(good), digest(weak)}
    enforce = IntakeConfig(mode="enforce")
    kept, held = apply_intake([good, weak, new], report, enforce)
    assert kept == [good]
    assert {q.task_id: q.reasons for q in held} == {weak.task_id: ["wrong_solution_passes", "weak_tests"],
                                                    new.task_id: ["unchecked"]}
    assert apply_intake([good, weak, new], report, IntakeConfig(mode="warn"))[0] == [good, weak, new]
    assert apply_intake([good, weak, new], None, IntakeConfig(mode="off")) == ([good, weak, new], [])
    # the threshold is read when the report is used: a lower one lets the weak task's score pass
    assert reasons_of(failing, IntakeConfig(min_mutation_score=0.4)) == ["wrong_solution_passes"]
    # an edited task is a new digest: unchecked again
    edited = msgspec.structs.replace(good, difficulty=good.difficulty + 1)
    assert apply_intake([edited], report, enforce)[1][0].reasons == ["unchecked"]


def test_static_checks_of_the_suite_with_a_held_out_split() -> None:
    from rollstream.tasks.sources import split_tasks

    suite = builtin_tasks()
    _, held = split_tasks(suite, 0.25)
    found = static_checks(suite, humaneval_tasks(), held, IntakeConfig())
    assert found.personal_data == {}
    assert set(found.contamination).isdisjoint(found.held_out)  # the held-out side is what is compared with
    for cluster in found.clusters:  # clusters are whole on one side, so never contaminate across the split
        assert len(set(cluster.members) & set(found.held_out)) in (0, len(cluster.members))


PARAMETRIZED = """\
import pytest
from solution import CASES, square
import solution as s

DATA = [(1, 1), (2, 4)]


@pytest.mark.parametrize("x, y", CASES)
def test_from_the_completion(x, y):
    assert square(x) == y


@pytest.fixture(params=s.SIZES)
def size(request):
    return request.param


@pytest.mark.parametrize("x, y", DATA + [(i, i * i) for i in range(3)])
def test_own(x, y):
    assert square(x) == y


@pytest.mark.parametrize("x", helper_values())
def test_setup_values(x):
    assert square(x) >= 0
"""


def test_a_pytest_file_parametrized_over_the_completions_names_is_a_finding() -> None:
    """Tests collected from the completion's data: it chooses how many there are and what they check."""
    setup = "def helper_values():\n    return [1, 2]\n"
    assert completion_parameters("python_pytest", setup, [PARAMETRIZED]) == ["file 0: CASES, s.SIZES"]
    own = PARAMETRIZED.replace('"x, y", CASES', '"x, y", DATA').replace("params=s.SIZES", "params=[1, 2]")
    assert completion_parameters("python_pytest", setup, [own, "def test_x():\n    pass\n"]) == []
    # a name neither the file nor the setup binds is the completion's too
    assert completion_parameters("python_pytest", "", [own]) == ["file 0: helper_values"]
    assert completion_parameters("python_tests", "", [PARAMETRIZED]) == []
    check = TaskCheck(task_id="t", family="f", digest="d", reference_passes=True,
                      params_from_completion=["file 0: CASES"])
    assert reasons_of(check, IntakeConfig()) == ["params_from_completion"]
