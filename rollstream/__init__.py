"""rollstream: asynchronous RL post-training with execution feedback, as a Kafka stream.

The ``rollstream`` package is the wiring every stage shares: config, errors, retry, the
Kafka/Redis helpers, the weight store, the model loader, metrics and the local
infrastructure. It imports no stage. The stages and the entry points are installed under its
name from folders of their own in the repository: ``rollstream.schemas`` (``schemas/``),
``rollstream.producers``, ``rollstream.consumers``, ``rollstream.streams``,
``rollstream.learner``, and above them all ``rollstream.cli`` (``cli/``: the command,
``rollstream run``, ``rollstream eval``).
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# A source checkout that is not installed (or a second checkout next to the installed one):
# the stage folders sit beside this one; find them there, as pyproject.toml maps them.
_ROOT = _Path(__file__).resolve().parent.parent
if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "schemas" / "__init__.py").is_file():
    __path__.append(str(_ROOT))  # noqa: F821 (a package's __path__)
