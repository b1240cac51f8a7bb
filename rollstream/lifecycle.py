"""Process lifecycle shared by the stages: logging set-up and graceful stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import subprocess
import threading
import time


def stop_event(grace_s: float | None = None) -> asyncio.Event:
    """An event set on the first SIGTERM or SIGINT: stop taking input, finish, commit, exit 0.

    With ``grace_s`` (``infra.stop_grace_s``) the stop is bounded: what is still in flight
    :func:`abandon_after` seconds after the signal is abandoned (the task that called this,
    the stage's main task, is cancelled: its consumers commit only what is done and leave their
    groups, so the next owner redoes the rest), and at ``grace_s`` the process ends at once,
    whatever it is doing (a generate call in a thread cannot be cancelled).

    A second signal is left to the default handler (so a stuck stage can still be killed).
    """
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    main = asyncio.current_task()
    logger = logging.getLogger("rollstream")

    def _abandon() -> None:
        if main is not None and not main.done():
            logger.warning("still busy %.1f s after the stop: abandoning the work in flight uncommitted "
                           "(the next owner redoes it)", abandon_after(grace_s or 0.0))
            main.cancel(ABANDONED)

    def _stop(signum: int) -> None:
        logger.info("received %s: stopping", signal.Signals(signum).name)
        event.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if grace_s is not None:
            loop.call_later(abandon_after(grace_s), _abandon)
            threading.Thread(target=_end_at, args=(grace_s,), name="stop-bound", daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop, sig)
    return event


ABANDONED = "stop bound reached: in-flight work abandoned"


def abandon_after(grace_s: float) -> float:
    """When, after a stop, work still in flight is abandoned: 3 s before the bound, or half of it."""
    return grace_s - 3.0 if grace_s >= 6.0 else grace_s / 2


def _end_at(grace_s: float) -> None:
    time.sleep(grace_s)
    logging.getLogger("rollstream").warning("stop bound of %.1f s reached: exiting now", grace_s)
    logging.shutdown()
    os._exit(0)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # aiokafka logs every rebalance at INFO; keep it at WARNING unless asked.
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLogger().level))


def tune_gc(young_threshold: int = 20_000) -> None:
    """Tune the garbage collector for a long-running stage.

    Stages allocate many short-lived containers per batch (every decoded event holds lists of
    token ids), and by default the collector runs every 700 allocations and rescans everything
    imported at start-up (torch, transformers). Freezing the start-up heap and collecting the
    young generation less often cut event decoding cost by about a third (bench/plumbing.py).
    Reference cycles are still collected, only less often.
    """
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)


def terminate(procs: list[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM every running process of ``procs`` in the given order (each commits and exits), then
    wait for them all; SIGKILL what is still running after ``timeout_s``."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
