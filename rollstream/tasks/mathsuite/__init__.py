"""The built-in math suite: generated problems with exact answers (source ``suite:math``).

``build.py`` writes ``<family>.jsonl`` here from a fixed seed; tasks/sources.py loads them.
"""
