"""The command line's tables and progress bars, all drawn by ``rich`` (imported only by the
commands that print them, so ``rollstream --help`` stays fast).

:func:`table` renders rows as text: a plain aligned table, or Markdown (``markdown=True``: what
``eval`` and ``compare`` print, pasted into docs as is). :func:`progress` is a bar on stderr.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

WIDTH = 200  # wide enough that no column is cut; a table is as wide as its cells
# rich's SIMPLE_HEAD, drawn in ASCII (logs and pipes stay plain text)
PLAIN = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, markdown: bool = False,
          right: Sequence[str] = (), header: bool = True) -> str:
    """``rows`` under ``columns`` as text (no trailing newline). ``right``: columns aligned right
    (numbers); ``header=False``: no header line (a two-column list of names and values)."""
    grid = Table(box=box.MARKDOWN if markdown else PLAIN, show_header=header, show_edge=markdown,
                 pad_edge=markdown, padding=(0, 1) if markdown else (0, 2, 0, 0))
    for name in columns:
        grid.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        grid.add_row(*("-" if cell is None else str(cell) for cell in row))
    out = io.StringIO()
    Console(file=out, width=WIDTH, color_system=None, highlight=False, emoji=False, markup=False).print(grid)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines() if line.strip())


@contextmanager
def progress(what: str, total: int) -> Iterator[Any]:
    """A progress bar for ``total`` steps on stderr; yields a function to call once per step done."""
    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True))
    with bar:
        task = bar.add_task(what, total=total)
        yield lambda: bar.advance(task)
