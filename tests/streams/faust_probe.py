"""A stage that only records what the Faust runtime hands it, run as a worker process by
tests/streams/test_faust_runtime.py:

    python -m tests.streams.faust_probe --config X.toml --out OUT.jsonl [--fail-first-batch]

One JSON line per call: ``{"batch": [[topic, partition, offset, key hex, value hex], ...]}``,
``{"sweep": [partitions]}``, and ``{"overlap": true}`` whenever a call starts while another
is still running (the runtime promises that never happens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from rollstream.config_load import load_config
from rollstream.infra import resolve_endpoints
from rollstream.kafka import RawRecord
from rollstream.lifecycle import setup_logging
from rollstream.streams.faust_runtime import serve

CALL_S = 0.05  # each call takes this long, so that an overlapping call would be caught


class ProbeStage:
    def __init__(self, out: Path, fail_first_batch: bool) -> None:
        self.out = out
        self.fail_first_batch = fail_first_batch
        self.busy = False

    def write(self, line: dict) -> None:
        with self.out.open("a") as f:
            f.write(json.dumps(line) + "\n")

    async def call(self, line: dict) -> None:
        if self.busy:
            self.write({"overlap": True})
        self.busy = True
        try:
            await asyncio.sleep(CALL_S)
            self.write(line)
        finally:
            self.busy = False

    async def handle(self, records: Sequence[RawRecord]) -> None:
        hexed = [[r.topic, r.partition, r.offset, r.key and r.key.hex(), r.value and r.value.hex()] for r in records]
        await self.call({"batch": hexed})
        if self.fail_first_batch:
            raise RuntimeError("probe: the first batch fails")

    async def sweep(self, partitions: Sequence[int]) -> None:
        await self.call({"sweep": sorted(partitions)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-first-batch", action="store_true")
    args = parser.parse_args()
    setup_logging("INFO")
    config = load_config(args.config)
    stage = ProbeStage(Path(args.out), args.fail_first_batch)
    asyncio.run(serve(stage, config, resolve_endpoints(config)))


if __name__ == "__main__":
    main()
