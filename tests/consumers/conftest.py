"""Fixtures of the generator's tests (tests/consumers/test_backends.py, test_sglang_backend.py,
test_generator_stage.py). The executor's fixtures live in tests/consumers/sandbox_fixtures.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.consumers.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def short_context_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama-ctx32"), max_positions=32)
