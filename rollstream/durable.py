"""Writing files so that they survive a crash: what checkpoints and the run archive share."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: str | Path) -> None:
    """Make a rename or a new file in ``directory`` durable (the directory entry itself)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
