"""The stage table is the one place the pipeline is declared: the command line, `rollstream run`,
the watcher and the README read it, and it agrees with the topic table."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstream.cli.stages import STAGE_COMMANDS
from rollstream.cli.watch import HOPS
from rollstream.schemas import TOPICS
from rollstream.schemas.stages import OBSERVERS, RUN_ORDER, SPECS, STAGES, consumer_group, topics_table

pytestmark = pytest.mark.unit
README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_topic_has_a_writer_and_every_stage_topic_exists() -> None:
    for spec in STAGES:
        assert set(spec.consumes) | set(spec.produces) <= set(TOPICS), spec.name
        assert (spec.group is None) == (not spec.consumes), spec.name
    for name in TOPICS:
        assert any(name in s.produces for s in STAGES), f"{name}: nobody writes it"


def test_the_flow_runs_sampler_to_learner() -> None:
    assert HOPS == {"prompts": ("sampler", "generator"), "actions": ("generator", "executor"),
                    "rewards": ("executor", "stream"), "advantages": ("stream", "learner")}


def test_commands_and_run_order_come_from_the_specs() -> None:
    assert list(STAGE_COMMANDS) == [s.name for s in STAGES]
    assert sorted(RUN_ORDER) == sorted(SPECS)
    for topic, (writer, reader) in HOPS.items():  # a reader starts before its writer, so nothing waits unread
        assert RUN_ORDER.index(reader) < RUN_ORDER.index(writer), topic
    assert RUN_ORDER.index("sampler") > max(RUN_ORDER.index(s) for s in SPECS if s not in OBSERVERS | {"sampler"})
    assert consumer_group("run1.", "generator") == "run1.generators"


def test_the_readme_topic_table_is_the_specs() -> None:
    assert topics_table() in README.read_text(), "README.md's topic table differs: paste schemas.stages.topics_table()"
