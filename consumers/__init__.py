"""The consumer stages, one sub-package each: ``generator/`` (``prompts`` -> ``actions``,
transformers, SGLang or simulated backends) and ``archiver/`` (every topic -> the run archive).
The executor (``actions`` -> ``rewards`` + ``audit``, Docker sandboxes) is ``executor.py`` with
its sandbox (``sandbox.py``, ``sim_sandbox.py``, ``image.py``), scoring (``rewards.py``,
``score.py``, ``episodes.py``) and in-container runtime (``runner.py``, ``judge.py``,
``candidate.py``, ``plain.py``); it moves into ``executor/`` (the runtime in ``executor/runtime/``).
Stages never import each other (the import contracts in pyproject.toml say so)."""
