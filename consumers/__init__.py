"""The consumer stages, one sub-package each: ``generator/`` (``prompts`` -> ``actions``,
transformers, SGLang or simulated backends), ``executor/`` (``actions`` -> ``rewards`` + ``audit``:
the stage, its Docker sandbox pool, reward rules, reference checks, and the in-container runtime
in ``executor/runtime/``) and ``archiver/`` (every topic -> the run archive). Stages never import
each other (the import contracts in pyproject.toml say so)."""
