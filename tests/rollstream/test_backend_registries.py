"""Each stage's backends are a registry keyed by the config's tags: every kind the config accepts
builds something, and a kind nobody registered is refused naming the registered ones."""

from __future__ import annotations

import typing

import msgspec
import pytest

from rollstream.config import Config, ExecutorConfig, GeneratorConfig, LearnerConfig

pytestmark = pytest.mark.unit


def tags(section: type, field: str) -> set[str]:
    hints = typing.get_type_hints(section)[field]
    return {msgspec.inspect.type_info(t).tag for t in typing.get_args(hints) or (hints,)}


@pytest.mark.parametrize("stage", ["generator", "executor", "learner"])
def test_every_configurable_kind_is_registered(stage):
    from rollstream.consumers.executor.backends import BACKENDS as SANDBOXES
    from rollstream.consumers.generator.stage import BACKENDS as GENERATORS
    from rollstream.learner.trainer import TRAINERS

    registry, section = {"generator": (GENERATORS, GeneratorConfig), "executor": (SANDBOXES, ExecutorConfig),
                         "learner": (TRAINERS, LearnerConfig)}[stage]
    kinds = tags(section, "backend")
    assert kinds and kinds <= set(registry.names()), (kinds, registry.names())


def test_a_kind_nobody_registered_names_the_registered_ones():
    from rollstream.consumers.generator.stage import BACKENDS

    with pytest.raises(ValueError, match="unknown generator backend 'vllm'; registered: scripted, sglang, sim"):
        BACKENDS.get("vllm")


def test_the_sim_generator_is_built_from_its_tag():
    from rollstream.config_load import load_config
    from rollstream.consumers.generator.backends.scripted import SimBackend
    from rollstream.consumers.generator.stage import build_backend

    config = load_config(None, ["generator.backend=sim"])
    assert isinstance(config, Config) and isinstance(build_backend(config), SimBackend)
