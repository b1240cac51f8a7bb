"""Task sources: builtin, JSONL, HumanEval from the package, local Hugging Face datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollstream.errors import ConfigError
from rollstream.schemas.tasks import encode_task
from rollstream.tasks.sources import builtin_tasks, load_tasks, task_from_row

pytestmark = pytest.mark.unit


def run_tests_locally(code: str, tests: list[str], setup: str = "") -> bool:
    """Exec code + tests in a fresh namespace (trusted reference code only)."""
    namespace: dict = {}
    exec(setup + "\n" + code, namespace)  # noqa: S102
    for test in tests:
        exec(test, namespace)  # noqa: S102
    return True


def test_humaneval_from_the_package() -> None:
    tasks = load_tasks(["humaneval"])
    assert len(tasks) == 164 and {t.family for t in tasks} == {"humaneval"}
    first = tasks[0]
    assert first.reward.tests[0].rstrip().endswith(f"check({first.reward.entry_point})")
    assert "```python" in first.prompt
    for task in tasks[:5]:  # the canonical solution passes its own check()
        assert run_tests_locally(task.reference_solution, task.reward.tests)


def test_jsonl_source_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    tasks = builtin_tasks()[:3]
    path.write_bytes(b"".join(encode_task(t) + b"\n" for t in tasks) + b"\n")
    assert [t.task_id for t in load_tasks([f"jsonl:{path}"])] == sorted(t.task_id for t in tasks)
    with pytest.raises(ConfigError, match="already came from"):
        load_tasks(["builtin", f"jsonl:{path}"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x", "prompt": "p", "nope": 1}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        load_tasks([f"jsonl:{bad}"])


MBPP_ROW = {"task_id": 2, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
            "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_setup_code": "",
            "challenge_test_list": []}


def test_row_formats() -> None:
    mbpp = task_from_row(MBPP_ROW, "mbpp")
    assert mbpp.task_id == "mbpp/2" and mbpp.reward.entry_point == "add" and len(mbpp.reward.tests) == 2
    assert run_tests_locally(mbpp.reference_solution, mbpp.reward.tests)
    spec = json.loads(encode_task(builtin_tasks()[0]))
    assert task_from_row(spec, "ignored").family == builtin_tasks()[0].family
    with pytest.raises(ConfigError):
        task_from_row({"question": "?"}, "x")


def test_hf_datasets_from_local_files_only(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [MBPP_ROW, {**MBPP_ROW, "task_id": 3}]
    jsonl = tmp_path / "mbpp_small.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from_file = load_tasks([f"hf:{jsonl}"])
    assert [t.task_id for t in from_file] == ["mbpp_small/2", "mbpp_small/3"]
    saved = tmp_path / "mbpp_disk"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    assert [t.task_id for t in load_tasks([f"hf:{saved}"])] == ["mbpp_disk/2", "mbpp_disk/3"]
    with pytest.raises(ConfigError, match="does not exist"):
        load_tasks([f"hf:{tmp_path / 'missing'}"])


def test_the_held_out_split_is_whole_tasks_of_every_family_and_stable() -> None:
    from rollstream.tasks.sources import builtin_tasks, split_tasks

    tasks = builtin_tasks()
    trained, held = split_tasks(tasks, 0.25, seed=0)
    assert {t.task_id for t in trained}.isdisjoint(t.task_id for t in held)
    assert len(trained) + len(held) == len(tasks)
    assert {t.family for t in held} == {t.family for t in tasks}  # every family keeps some back
    # the same tasks whatever else is in the list: removing other tasks does not move the split
    # (of a family none of whose tasks has a duplicate in another family)
    some = [t for t in tasks if t.family == "conditionals"]
    assert {t.task_id for t in split_tasks(some, 0.25, seed=0)[1]} == {t.task_id for t in held
                                                                        if t.family == "conditionals"}
    assert {t.task_id for t in split_tasks(tasks, 0.25, seed=1)[1]} != {t.task_id for t in held}
    assert split_tasks(tasks, 0.0) == (tasks, [])


def test_the_held_out_split_keeps_every_duplicate_cluster_whole() -> None:
    """Functionally identical siblings (the same reference, nearly the same prompt or code) are
    held out together or trained on together, for any seed."""
    from rollstream.tasks.dedup import duplicate_clusters
    from rollstream.tasks.sources import builtin_tasks, split_tasks

    tasks = builtin_tasks()
    clusters = duplicate_clusters(tasks)
    assert any({"bits/single_number", "bits/xor_all"} <= set(c.members) for c in clusters)
    assert any({"recursion/climb_stairs", "recursion/fibonacci"} <= set(c.members) for c in clusters)
    for seed in range(5):
        trained, held = split_tasks(tasks, 0.25, seed=seed)
        held_ids = {t.task_id for t in held}
        for cluster in clusters:
            assert len(held_ids & set(cluster.members)) in (0, len(cluster.members)), (seed, cluster.members)
        assert len(held) >= 0.25 * len(tasks) - 1


@pytest.mark.unit
def test_task_sources_are_a_registry_keyed_by_their_name(tmp_path) -> None:
    """``name`` or ``name:ARG`` looked up in SOURCES: a registered source is loaded by its name, an
    unknown one names the registered ones, one that needs a path says so."""
    from rollstream.errors import ConfigError
    from rollstream.schemas.tasks import TaskSpec
    from rollstream.tasks.sources import SOURCES, load_source

    assert {"builtin", "jsonl", "humaneval", "hf", "outside"} <= set(SOURCES.names())
    SOURCES.register("fixed", lambda arg: [TaskSpec(task_id=f"fixed/{arg or 'none'}", prompt="p")])
    try:
        assert [t.task_id for t in load_source("fixed:x")] == ["fixed/x"]
        with pytest.raises(ConfigError, match=r"task source 'nope:1': .*registered: builtin, fixed, hf"):
            load_source("nope:1")
    finally:
        SOURCES._items.pop("fixed")
    for kind in ("jsonl", "hf"):
        with pytest.raises(ConfigError, match=f"needs a path: {kind}:PATH"):
            load_source(kind)
