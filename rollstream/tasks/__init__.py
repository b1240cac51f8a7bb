"""Tasks, below every stage: the task sources (``sources.py``: builtin, jsonl, HumanEval, local
datasets) and the built-in suite (``suite/``). The sampler, the simulated backends, ``replay`` and
``eval`` all read tasks from here."""
