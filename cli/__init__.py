"""The entry points, above the stages: the ``rollstream`` command (:mod:`rollstream.cli.main`),
``rollstream run`` (:mod:`rollstream.cli.run`) and ``rollstream eval``
(:mod:`rollstream.cli.evaluate`). Nothing below imports them."""

from rollstream.cli.main import main

__all__ = ["main"]
