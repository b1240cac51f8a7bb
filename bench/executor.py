"""Executor fast path vs a fresh hardened container per execution.

Measures, in one run, with the same image, limits and hardening:

* ``executions_per_s``: a small function checked by 3 asserts, run through the warm pool
  (consumers/executor/sandbox.py: one fork of the in-container runner per execution, fed over the attach
  stream), ``--concurrency`` executions in flight over ``--pool-size`` containers;
* ``baseline_executions_per_s``: the same program (code + the 3 asserts) in a fresh container per
  execution (create, attach, start, wait, remove: what ``docker run --rm`` does), same concurrency;
* ``speedup`` = executions_per_s / baseline_executions_per_s.

Usage: ``python bench/executor.py --quick --json OUT`` (needs dockerd and the sandbox image:
``rollstream sandbox build --offline``). Starts only containers labelled with its own owner label
and removes them at the end. The last line printed is the JSON of the headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollstream.config import ExecutorConfig
from rollstream.consumers.executor.sandbox import (
    LABEL,
    OWNER_LABEL,
    DockerSandboxPool,
    Job,
    hardened_config,
    limits_from_config,
)

CODE = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 3) == 5"]


async def fast_path(config: ExecutorConfig, n: int, concurrency: int) -> tuple[float, int]:
    """(executions/s, how many passed all 3 asserts) through the warm pool."""
    async with DockerSandboxPool(config) as pool:
        for i in range(min(50, n)):  # warm-up: containers started, runner forked a few times
            await pool.execute(Job(job_id=f"w{i}", code=CODE, tests=TESTS))
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> bool:
            async with gate:
                result = await pool.execute(Job(job_id=str(i), code=CODE, tests=TESTS))
            return sum(1 for e in result.events if e.get("e") == "test" and e.get("ok")) == 3

        started = time.perf_counter()
        passed = await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - started), sum(passed)


async def baseline(config: ExecutorConfig, n: int, concurrency: int) -> tuple[float, int]:
    """(executions/s, how many printed ok) with a fresh hardened container per execution."""
    import aiodocker

    program = CODE + "\n".join(TESTS) + "\nprint('ok')\n"
    body = hardened_config(
        config.image,
        limits_from_config(config),
        {LABEL: "1", OWNER_LABEL: config.owner},
        ["python3", "-I", "-c", program],
        interactive=False,
    )
    body["HostConfig"]["AutoRemove"] = (
        False  # removed by us after reading the exit code, like `docker run --rm`
    )
    gate = asyncio.Semaphore(concurrency)
    async with aiodocker.Docker() as docker:

        async def one() -> bool:
            async with gate:
                container = await docker.containers.create(body)
                try:
                    async with container.attach(stdout=True, stderr=True) as stream:
                        await container.start()
                        output = b""
                        while (message := await stream.read_out()) is not None:
                            output += message.data
                    status = await container.wait()
                    return status.get("StatusCode") == 0 and output.strip() == b"ok"
                finally:
                    await container.delete(force=True)

        await one()  # warm-up (image layers in the page cache)
        started = time.perf_counter()
        passed = await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - started), sum(passed)


async def cleanup(owner: str) -> None:
    import aiodocker

    async with aiodocker.Docker() as docker:
        found = await docker.containers.list(
            all=True, filters=json.dumps({"label": [f"{OWNER_LABEL}={owner}"]})
        )
        for container in found:
            try:
                await container.delete(force=True)
            except aiodocker.DockerError:
                pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (< 2 min)")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--image", default="rollstream-sandbox:latest")
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    n_fast, n_base = (1000, 12) if args.quick else (5000, 40)
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    config = ExecutorConfig(
        image=args.image,
        owner=owner,
        pool_size=args.pool_size,
        concurrency=args.concurrency,
        recycle_after=1_000_000,
    )
    try:
        rate, ok = await fast_path(config, n_fast, args.concurrency)
        sequential, _ = await fast_path(
            ExecutorConfig(image=args.image, owner=owner, pool_size=1, recycle_after=1_000_000),
            n_fast // 2,
            1,
        )
        base, base_ok = await baseline(config, n_base, args.concurrency)
    finally:
        await cleanup(owner)
    if ok != n_fast or base_ok != n_base:
        raise SystemExit(f"wrong results: fast path {ok}/{n_fast}, baseline {base_ok}/{n_base} passed")
    figures = {
        "executions_per_s": round(rate, 1),
        "speedup": round(rate / base, 1),
        "baseline_executions_per_s": round(base, 2),
        "sequential_executions_per_s": round(sequential, 1),
        "executions": n_fast,
        "baseline_executions": n_base,
        "pool_size": args.pool_size,
        "concurrency": args.concurrency,
    }
    print(
        f"fast path: {n_fast} executions, {rate:.1f}/s ({args.concurrency} in flight over {args.pool_size} "
        f"warm containers; one container sequentially: {sequential:.1f}/s)"
    )
    print(f"baseline: {n_base} fresh hardened containers, {base:.2f}/s; speedup {rate / base:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
