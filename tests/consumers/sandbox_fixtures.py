"""Fixtures for the executor's tests (imported by them explicitly, so tests/consumers/conftest.py
stays the generator's): the sandbox image and pools with a unique owner label.

Tests that need Docker skip when there is no daemon or no sandbox image (CI builds it first:
`rollstream sandbox build --offline`). Each pool gets its own owner label; teardown removes
only containers carrying that label.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest

from consumers.rewards import RewardRegistry, default_registry
from consumers.sandbox import LABEL, OWNER_LABEL, DockerSandboxPool
from rollstream.config import ExecutorConfig

IMAGE = "rollstream-sandbox:latest"


@pytest.fixture(scope="session")
async def sandbox_image() -> str:
    aiodocker = pytest.importorskip("aiodocker")
    try:
        docker = aiodocker.Docker()
    except Exception as exc:  # no socket
        pytest.skip(f"no docker daemon: {exc}")
    try:
        await docker.images.inspect(IMAGE)
    except aiodocker.DockerError:
        pytest.skip(f"sandbox image {IMAGE} missing: run `rollstream sandbox build --offline`")
    except Exception as exc:
        pytest.skip(f"no docker daemon: {exc}")
    finally:
        await docker.close()
    return IMAGE


async def containers_of(owner: str) -> list[dict]:
    import aiodocker

    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters=json.dumps({"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
        )
        return [c._container for c in found]


async def remove_containers_of(owner: str) -> int:
    import aiodocker

    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters=json.dumps({"label": [f"{LABEL}=1", f"{OWNER_LABEL}={owner}"]})
        )
        for container in found:
            try:
                await container.delete(force=True)
            except aiodocker.DockerError:
                pass
        return len(found)


@pytest.fixture
async def owner() -> AsyncIterator[str]:
    """A unique owner label; whatever still carries it at the end is removed."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    await remove_containers_of(name)


@pytest.fixture
def executor_config(sandbox_image: str, owner: str) -> ExecutorConfig:
    return ExecutorConfig(image=sandbox_image, owner=owner, pool_size=1, concurrency=1, recycle_after=500)


@pytest.fixture
async def pool(executor_config: ExecutorConfig) -> AsyncIterator[DockerSandboxPool]:
    async with DockerSandboxPool(executor_config, grace_s=3.0) as pool:
        yield pool


@pytest.fixture
def registry() -> RewardRegistry:
    return default_registry(entry_points=[])
