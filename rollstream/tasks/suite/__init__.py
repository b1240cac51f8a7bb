"""The built-in task suite: ``<family>.jsonl`` files made by ``build_suite.py`` (do not edit by hand)."""
