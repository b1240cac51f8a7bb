"""The shipped suites' JSONL files: one file per group of tasks, written or checked by a build script."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from rollstream.schemas.tasks import TaskSpec, encode_task


def render_grouped(tasks: list[TaskSpec], group: Callable[[TaskSpec], str]) -> dict[str, bytes]:
    """File name (``{group}.jsonl``) -> its tasks, one JSON line each, sorted by task id."""
    grouped: dict[str, list[TaskSpec]] = {}
    for task in tasks:
        grouped.setdefault(group(task), []).append(task)
    return {f"{name}.jsonl": b"".join(encode_task(t) + b"\n" for t in sorted(ts, key=lambda t: t.task_id))
            for name, ts in sorted(grouped.items())}


def write_or_check(files: dict[str, bytes], directory: Path, what: str, groups: str, description: str,
                   argv: list[str] | None = None) -> int:
    """A build script's main: write ``files`` into ``directory``, or with ``--check`` exit 1 if any
    file on disk differs (``what``: the suite's name in messages; ``groups``: what a file holds)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="fail if the files on disk are stale")
    args = parser.parse_args(argv)
    stale = [n for n, c in files.items() if not (directory / n).exists() or (directory / n).read_bytes() != c]
    if args.check:
        print("stale: " + ", ".join(stale) if stale else f"{what} is up to date")
        return 1 if stale else 0
    for name, content in files.items():
        (directory / name).write_bytes(content)
    counts = {n: c.count(b"\n") for n, c in files.items()}
    print(f"{sum(counts.values())} tasks in {len(counts)} {groups}: {counts}")
    return 0
