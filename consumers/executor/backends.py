"""Sandbox backends by their config tag (``executor.backend.kind``): ``docker`` (the aiodocker pool,
consumers/executor/pool.py) and ``sim`` (sleeps and scripted verdicts, consumers/executor/sim_sandbox.py).
A builder opens its backend on the stage's exit stack, so whatever it holds is closed with the stage.
More register through the ``rollstream.sandbox_backends`` entry-point group."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from rollstream.config import Config
from rollstream.registry import Registry


async def _docker(config: Config, stack: AsyncExitStack) -> Any:
    from rollstream.consumers.executor.pool import DockerSandboxPool

    return await stack.enter_async_context(DockerSandboxPool(config.executor))


async def _sim(config: Config, stack: AsyncExitStack) -> Any:
    from rollstream.consumers.executor.sim_sandbox import SimSandbox

    return SimSandbox.from_config(config)


BACKENDS: Registry[Callable[[Config, AsyncExitStack], Awaitable[Any]]] = Registry(
    "sandbox backend", "rollstream.sandbox_backends", "BACKENDS.register", {"docker": _docker, "sim": _sim})


async def open_backend(config: Config, stack: AsyncExitStack) -> Any:
    """The configured sandbox backend (a :class:`~rollstream.consumers.executor.jobs.SandboxBackend`)."""
    return await BACKENDS.get(config.executor.backend.kind)(config, stack)
