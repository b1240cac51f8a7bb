"""What the benchmark scripts share: a local broker for the run, the report, the raw Redis baseline."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rollstream.infra import free_port, start_broker, stop_pid
from rollstream.weights import pipeline_batches


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


async def raw_redis_set_get(client: Any, prefix: str, chunks: list[memoryview], pipeline_bytes: int, *,
                            assemble: bool = False) -> float:
    """Bytes/s of plain redis-py pipelined SET then GET of ``chunks`` under ``{prefix}raw:{i}``, in
    the round trips the weight store uses; with ``assemble`` the values read are also copied into
    one buffer (what loading them costs)."""
    batches = pipeline_batches([c.nbytes for c in chunks], pipeline_bytes)
    total = sum(c.nbytes for c in chunks)
    started = time.perf_counter()
    for batch in batches:
        async with client.pipeline(transaction=False) as pipe:
            for i in batch:
                pipe.set(f"{prefix}raw:{i}", chunks[i])
            await pipe.execute()
    out = bytearray(total) if assemble else None
    offset = 0
    for batch in batches:
        async with client.pipeline(transaction=False) as pipe:
            for i in batch:
                pipe.get(f"{prefix}raw:{i}")
            values = await pipe.execute()
        if out is not None:
            for value in values:
                out[offset : offset + len(value)] = value
                offset += len(value)
    return total / (time.perf_counter() - started)
