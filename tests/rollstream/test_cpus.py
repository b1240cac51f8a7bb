"""Stage placement on CPU cores (rollstream/cpus.py), in a child process so the test run keeps its cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CHILD = """
import json, os, sys, threading
from rollstream.cpus import pin
from rollstream.errors import ConfigError
cpus = json.loads(sys.argv[1])
started = threading.Event(); release = threading.Event()
def worker():
    started.set(); release.wait()
early = threading.Thread(target=worker); early.start(); started.wait()  # a thread already running
try:
    pin(cpus, "learner")
except ConfigError as exc:
    print(json.dumps({"error": str(exc)})); release.set(); sys.exit(0)
later = threading.Thread(target=worker); later.start()  # a thread started after
masks = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
release.set(); early.join(); later.join()
print(json.dumps({"masks": list(masks.values())}))
"""


def child(cpus: list[int]) -> dict:
    import json

    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cpus)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pin_moves_every_thread_and_the_ones_started_later() -> None:
    one = min(os.sched_getaffinity(0))
    result = child([one])
    assert len(result["masks"]) >= 3  # main, the early thread, the later one
    assert all(mask == [one] for mask in result["masks"])


def test_no_cores_leaves_placement_alone() -> None:
    result = child([])
    assert all(mask == sorted(os.sched_getaffinity(0)) for mask in result["masks"])


def test_a_core_the_process_cannot_use_is_a_config_error() -> None:
    missing = max(os.sched_getaffinity(0)) + 64
    result = child([missing])
    assert "learner.cpus" in result["error"] and str(missing) in result["error"]


def quick(*overrides: str):
    from rollstream.config_load import load_config, profile_path

    return load_config(None, list(overrides), profile=str(profile_path("quick")))


def test_split_gives_learner_and_generator_disjoint_cores_and_threads_to_match() -> None:
    from rollstream.cpus import split

    placed, said = split(quick("generator.torch_threads=0"), [0, 1])
    assert placed == ["learner.cpus=[0]", "generator.cpus=[1]", "learner.torch_threads=1",
                      "generator.torch_threads=1"]
    assert "learner on cores [0]" in said
    placed, _ = split(quick("generator.torch_threads=0"), [7, 3, 5, 1, 2])  # the learner takes the larger half
    assert placed[:2] == ["learner.cpus=[1, 2, 3]", "generator.cpus=[5, 7]"]
    assert placed[2:] == ["learner.torch_threads=3", "generator.torch_threads=2"]
    placed, _ = split(quick("learner.torch_threads=2", "generator.torch_threads=8"), [0, 1, 2, 3])
    assert placed[2:] == ["learner.torch_threads=2", "generator.torch_threads=2"]  # set: kept; never above its cores


def test_split_leaves_placement_alone_where_it_does_not_apply() -> None:
    from rollstream.cpus import split

    cases = [
        (quick("learner.cpus=[1]"), {}, "as configured"),
        (quick("generator.backend=sglang"), {}, "does not compute on this CPU"),
        (quick("learner.device=cuda"), {}, "does not compute on this CPU"),
        (quick(), {"generators": 2}, "more than one"),
        (quick(), {"learner_ranks": 2}, "more than one"),
    ]
    for config, kwargs, reason in cases:
        placed, said = split(config, [0, 1], **kwargs)
        assert placed == [] and reason in said
    assert split(quick(), [0])[0] == []
