"""The one place third-party errors become rollstream's: rollstream.errors.converted."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import aiodocker.exceptions
import aiohttp
import aiokafka.errors
import httpx
import pytest
import redis.exceptions

from rollstream.errors import (
    BackendError,
    ConfigError,
    InfraError,
    KafkaError,
    RollstreamError,
    SandboxError,
    WeightStoreError,
    converted,
)

pytestmark = pytest.mark.unit

REQUEST = httpx.Request("POST", "http://sglang.test/generate")


@pytest.mark.parametrize(
    ("error", "ours", "detail"),
    [
        (aiokafka.errors.KafkaConnectionError("no broker"), KafkaError, "KafkaConnectionError: no broker"),
        (aiokafka.errors.KafkaTimeoutError(), KafkaError, "KafkaTimeoutError"),
        (redis.exceptions.ConnectionError("refused"), InfraError, "ConnectionError: refused"),
        (redis.exceptions.TimeoutError("slow"), InfraError, "TimeoutError: slow"),
        (aiodocker.exceptions.DockerError(500, "daemon down"), SandboxError, "DockerError: "),
        (aiohttp.ClientConnectionError("socket"), InfraError, "ClientConnectionError: socket"),
        (httpx.ConnectError("refused", request=REQUEST), BackendError, "ConnectError: refused"),
        (httpx.ReadTimeout("slow", request=REQUEST), BackendError, "ReadTimeout: slow"),
        (ConnectionRefusedError(111, "refused"), InfraError, "ConnectionRefusedError: [Errno 111] refused"),
        (OSError("disk"), InfraError, "OSError: disk"),
        (TimeoutError(), InfraError, "TimeoutError"),
    ],
)
def test_third_party_io_errors_become_ours(error: Exception, ours: type, detail: str) -> None:
    with pytest.raises(ours) as raised, converted("doing the thing"):
        raise error
    assert type(raised.value) is ours
    assert str(raised.value).startswith(f"doing the thing failed: {detail}")
    assert raised.value.__cause__ is error  # raise ... from


def test_the_call_site_can_name_the_class() -> None:
    error = redis.exceptions.ConnectionError("refused")
    expected = "fetching weights version 3 failed: ConnectionError: refused"
    with pytest.raises(WeightStoreError, match=expected), converted("fetching weights version 3",
                                                                    into=WeightStoreError):
        raise error


@pytest.mark.parametrize("error", [ConfigError("ours"), KeyError("a bug"), ValueError("bad input"),
                                   asyncio.CancelledError(), KeyboardInterrupt()])
def test_ours_bugs_and_cancellations_pass_unchanged(error: BaseException) -> None:
    with pytest.raises(type(error)) as raised, converted("x", into=KafkaError):
        raise error
    assert raised.value is error


def test_success_passes_and_a_lazy_name_is_built_only_on_failure() -> None:
    built: list[str] = []

    def name() -> str:
        built.append("x")
        return "producing to {'t': [0]}"

    with converted(name, into=KafkaError):
        pass
    assert built == []
    expected = r"producing to \{'t': \[0\]\} failed: RequestTimedOutError"
    with pytest.raises(KafkaError, match=expected), converted(name, into=KafkaError):
        raise aiokafka.errors.RequestTimedOutError()
    assert built == ["x"]


async def test_works_around_awaits() -> None:
    async def refused() -> None:
        await asyncio.sleep(0)
        raise ConnectionResetError("reset")

    with pytest.raises(InfraError) as raised, converted("reading"):
        await refused()
    assert isinstance(raised.value, RollstreamError)


def test_the_errors_module_imports_no_third_party_library() -> None:
    code = ("import sys, rollstream.errors\n"
            "loaded = {'aiokafka', 'redis', 'aiodocker', 'aiohttp', 'httpx'} & set(sys.modules)\n"
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
