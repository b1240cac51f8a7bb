"""One flat exception hierarchy. Third-party errors are converted with ``raise ... from``,
in one place: :func:`converted` (the table ``THIRD_PARTY``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType


class RollstreamError(Exception):
    """Base of every error rollstream raises on purpose."""


class ConfigError(RollstreamError):
    """The configuration is wrong; the message names the key and what it accepts."""


class ModelError(RollstreamError):
    """A model or its tokenizer could not be found or loaded (rollstream/models.py)."""


class InfraError(RollstreamError):
    """Local infrastructure (broker, Redis, Docker) could not be started or reached."""


class KafkaError(RollstreamError):
    """Producing, consuming or administering topics failed after retries."""


class WeightStoreError(RollstreamError):
    """A weight version is missing, incomplete or corrupted; nothing was loaded."""


class SandboxError(RollstreamError):
    """The sandbox backend itself failed (not the code it ran)."""


class SandboxLost(SandboxError):
    """The machinery failed under a job that had been handed to a sandbox (the container or the
    engine lost mid-job, the runner dead before its reply, a container unfit for the job): not the
    code's doing. ``cause`` is a short label (metrics, the execution record)."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class BackendError(RollstreamError):
    """A generation backend failed (model load, server unreachable, bad response)."""


class CheckpointError(RollstreamError):
    """A checkpoint is missing or inconsistent."""


# The one place that turns third-party I/O errors into ours. Each entry: (module, class, the error
# of ours it becomes unless the call site says otherwise). Looked up in ``sys.modules``, so this
# module imports none of those libraries (an error of a library never imported cannot occur).
THIRD_PARTY: tuple[tuple[str, str, type[RollstreamError]], ...] = (
    ("aiokafka.errors", "KafkaError", KafkaError),
    ("redis.exceptions", "RedisError", InfraError),
    ("aiodocker.exceptions", "DockerError", SandboxError),
    ("aiohttp", "ClientError", InfraError),
    ("httpx", "HTTPError", BackendError),
)
# OSError covers ConnectionError and socket errors; TimeoutError is asyncio's too (3.11+).
BUILTIN_IO: tuple[type[BaseException], ...] = (OSError, TimeoutError)


def ours(exc: BaseException, what: str, into: type[RollstreamError] | None = None) -> RollstreamError | None:
    """``exc`` as rollstream's error (``into``, else the table's), or None when it is not a
    third-party I/O error (ours already, a bug, a cancellation): those are not converted."""
    if isinstance(exc, RollstreamError):
        return None
    kind: type[RollstreamError] | None = InfraError if isinstance(exc, BUILTIN_IO) else None
    for module_name, class_name, default in THIRD_PARTY:
        module = sys.modules.get(module_name)
        base = getattr(module, class_name, None) if module is not None else None
        if isinstance(base, type) and isinstance(exc, base):
            kind = default
            break
    if kind is None:
        return None
    detail = str(exc)
    name = type(exc).__name__
    if not detail.startswith(name):  # aiokafka's errors already start with their name
        detail = f"{name}: {detail}" if detail else name
    return (into or kind)(f"{what} failed: {detail}")


class converted:
    """Raise third-party I/O errors of the block as ours (``raise ... from``), see :func:`ours`.

    ``with converted("producing to actions", into=KafkaError): ...`` raises
    ``KafkaError("producing to actions failed: KafkaTimeoutError: ...")`` for an aiokafka error.
    ``into`` picks the class where the caller's contract names one (the weight store raises
    WeightStoreError for Redis faults); without it the table decides. ``what`` may be a callable,
    called only on failure, where naming the action costs something on a hot path.
    Builtin ``TimeoutError`` is converted too: keep ``asyncio.timeout`` signals outside the block.
    """

    __slots__ = ("into", "what")

    def __init__(self, what: str | Callable[[], str], *, into: type[RollstreamError] | None = None) -> None:
        self.what = what
        self.into = into

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if exc is None or not isinstance(exc, Exception):  # success, or a cancellation / exit
            return False
        mapped = ours(exc, self.what if isinstance(self.what, str) else self.what(), self.into)
        if mapped is None:
            return False
        raise mapped from exc
