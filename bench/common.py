"""What every benchmark script shares: a local broker for the run, and the report."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rollstream.infra import free_port, start_broker, stop_pid


def with_local_broker(bench: Callable[[str], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """Run ``bench(bootstrap)`` against a memory-only broker started for it, stopped (by pid) after."""
    port = free_port()
    proc = start_broker(port, Path(tempfile.mkdtemp()) / "broker.log")
    try:
        return asyncio.run(bench(f"127.0.0.1:{port}"))
    finally:
        stop_pid(proc.pid)


def report(figures: dict[str, Any], json_out: str | None) -> None:
    """Write the figures as JSON (when asked) and print them as the last line."""
    if json_out:
        Path(json_out).write_text(json.dumps(figures, indent=2))
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
