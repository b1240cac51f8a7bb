"""The sampler and the intake report: quarantined tasks are logged with their reasons and counted,
never silently dropped; ``warn`` trains on them, ``enforce`` does not (no broker needed)."""

from __future__ import annotations

import logging

import msgspec
import pytest

from rollstream.config import Config, InfraConfig, IntakeConfig
from rollstream.errors import ConfigError
from rollstream.metrics import StageMetrics
from rollstream.producers.sampler import intake_tasks
from rollstream.tasks.intake import TaskCheck, digest, save_report
from rollstream.tasks.sources import builtin_tasks

pytestmark = pytest.mark.unit


def test_failing_and_unchecked_tasks_are_quarantined_logged_and_counted(tmp_path, caplog) -> None:
    tasks = builtin_tasks()[:4]
    good = [TaskCheck(task_id=t.task_id, family=t.family, digest=digest(t), reference_passes=True, mutation_score=1.0)
            for t in tasks[:2]]
    contaminated = msgspec.structs.replace(good[0], task_id=tasks[2].task_id, digest=digest(tasks[2]),
                                           mutation_score=0.2, personal_data=[])
    save_report(tmp_path / "intake.json", [*good, contaminated], [])
    config = Config(infra=InfraConfig(state_dir=str(tmp_path)), intake=IntakeConfig(mode="enforce"))
    metrics = StageMetrics("sampler")
    with caplog.at_level(logging.INFO):
        kept = intake_tasks(config, tasks, metrics)
    assert kept == tasks[:2]
    assert f"task {tasks[2].task_id} fails intake (weak_tests): quarantined" in caplog.text
    assert "1 tasks are not in the intake report" in caplog.text and tasks[3].task_id in caplog.text
    value = metrics.registry.get_sample_value
    assert value("rollstream_sampler_quarantined_tasks", {"reason": "weak_tests"}) == 1
    assert value("rollstream_sampler_quarantined_tasks", {"reason": "unchecked"}) == 1

    warn = msgspec.structs.replace(config, intake=IntakeConfig(mode="warn"))
    assert intake_tasks(warn, tasks, StageMetrics("sampler")) == tasks
    off = msgspec.structs.replace(config, intake=IntakeConfig(mode="off", report=str(tmp_path / "none.json")))
    assert intake_tasks(off, tasks, StageMetrics("sampler")) == tasks
    nothing = msgspec.structs.replace(config, intake=IntakeConfig(mode="enforce", report=str(tmp_path / "none.json")))
    with pytest.raises(ConfigError, match="quarantined every task"):
        intake_tasks(nothing, tasks, StageMetrics("sampler"))
