"""The recipes in configs/ load as `rollstream run --config FILE` loads them (over the quick
profile) and validate; the mixed recipe trains on both domains and evaluates both domains'
held-out tasks (issue 55, item 5)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rollstream.config_load import load_config, profile_path
from rollstream.evaluator.stage import make_plan
from rollstream.tasks import domain_of

pytestmark = pytest.mark.unit

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


def recipe(path: Path):
    return load_config(path, environ={}, profile=str(profile_path("quick")))


def test_there_are_recipes() -> None:
    assert {p.name for p in CONFIGS} >= {"learning.toml", "mixed.toml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_recipe_loads_and_validates(path: Path) -> None:
    config = recipe(path)
    assert config.sampler.sources and 0 < config.sampler.holdout_fraction < 1


def test_the_mixed_recipe_trains_and_evaluates_both_domains() -> None:
    config = recipe(CONFIGS[[p.name for p in CONFIGS].index("mixed.toml")])
    assert config.sampler.sources == ["builtin", "suite:math"] and config.eval.every_versions > 0
    plan = make_plan(config)
    live = Counter(domain_of(task.reward.kind) for task, index in plan.live if index == 0)
    final = Counter(domain_of(task.reward.kind) for task, index in plan.final if index == 0)
    assert live["code"] > 0 and live["math"] > 0, live
    assert final["code"] > 0 and final["math"] > 0, final
