"""Generators (``consumers/generator.py``: ``prompts`` -> ``actions``, transformers or SGLang) and
executors (``consumers/executor.py``: ``actions`` -> ``rewards`` + ``audit``, Docker sandboxes)."""
