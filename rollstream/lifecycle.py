"""Process lifecycle shared by the stages: logging set-up and graceful stop on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import subprocess
import time


def stop_event() -> asyncio.Event:
    """An event set on the first SIGTERM or SIGINT: stop taking input, finish, commit, exit 0.

    A second signal is left to the default handler (so a stuck stage can still be killed).
    """
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def _stop(signum: int) -> None:
        logging.getLogger("rollstream").info("received %s: stopping", signal.Signals(signum).name)
        event.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop, sig)
    return event


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
