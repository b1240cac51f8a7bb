"""The one retry policy: the Backoff delay sequence and retry(), with a fake clock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rollstream.retry import Backoff, retry

pytestmark = pytest.mark.unit


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    no_jitter = Backoff(0.5, 3.0, rand=lambda: 0.0)
    assert [no_jitter.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    no_jitter.reset()
    assert no_jitter.next_delay() == 0.5


def test_backoff_jitter_only_shortens_so_the_cap_holds() -> None:
    most_jitter = Backoff(1.0, 4.0, jitter=0.5, rand=lambda: 1.0)
    assert [most_jitter.next_delay() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    real = Backoff(0.2, 5.0)
    for nominal in [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]:
        assert nominal * 0.5 <= real.next_delay() <= nominal


def test_backoff_first_delay_above_the_cap_is_capped() -> None:
    assert Backoff(5.0, 0.1, rand=lambda: 0.0).next_delay() == 0.1


@pytest.mark.parametrize("kwargs", [{"first_delay_s": -1}, {"max_delay_s": -1}, {"factor": 0.5},
                                    {"jitter": 2}])
def test_backoff_refuses_nonsense(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


class Flaky:
    """Fails with ``error`` ``failures`` times, then returns the call count."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.calls


class FakeClock:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def test_retry_until_it_works_with_growing_delays(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    action = Flaky(3, ConnectionError("refused"))
    with caplog.at_level(logging.WARNING, logger="rollstream.retry"):
        result = await retry(action, what="connect thing", retry_on=(ConnectionError,), attempts=4,
                             first_delay_s=1.0, max_delay_s=3.0, jitter=0.0, sleep=clock.sleep)
    assert result == 4 and action.calls == 4
    assert clock.slept == [1.0, 2.0, 3.0]
    assert [r.getMessage() for r in caplog.records] == [
        f"connect thing failed (attempt {n}/4): refused; retrying in {d:.1f}s"
        for n, d in [(1, 1.0), (2, 2.0), (3, 3.0)]
    ]


async def test_retry_gives_up_with_the_last_error_itself() -> None:
    clock = FakeClock()
    error = TimeoutError("slow")
    action = Flaky(10, error)
    with pytest.raises(TimeoutError) as raised:
        await retry(action, what="x", retry_on=(OSError, TimeoutError), attempts=3, sleep=clock.sleep)
    assert raised.value is error and action.calls == 3 and len(clock.slept) == 2  # no sleep after the last


async def test_errors_not_retried_propagate_at_once() -> None:
    clock = FakeClock()
    action = Flaky(1, KeyError("bug"))
    with pytest.raises(KeyError):
        await retry(action, what="x", retry_on=(OSError,), sleep=clock.sleep)
    assert action.calls == 1 and clock.slept == []


async def test_cancellation_is_never_retried() -> None:
    clock = FakeClock()
    action = Flaky(1, asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await retry(action, what="x", retry_on=(Exception,), sleep=clock.sleep)
    assert action.calls == 1


async def test_one_attempt_means_no_retry_and_zero_is_refused() -> None:
    clock = FakeClock()
    action = Flaky(1, OSError("down"))
    with pytest.raises(OSError):
        await retry(action, what="x", retry_on=(OSError,), attempts=1, sleep=clock.sleep)
    assert action.calls == 1 and clock.slept == []
    with pytest.raises(ValueError, match="attempts"):
        await retry(action, what="x", retry_on=(OSError,), attempts=0)


async def test_retry_sleeps_for_real_by_default() -> None:
    started = asyncio.get_running_loop().time()
    assert await retry(Flaky(2, OSError()), what="x", retry_on=(OSError,), first_delay_s=0.02) == 3
    assert asyncio.get_running_loop().time() - started >= 0.01 + 0.02  # at least half of 0.02 + 0.04
