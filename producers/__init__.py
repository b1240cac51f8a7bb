"""Prompt samplers: task sources, the built-in suite, the family mixture and the sampler stage
(``producers/sampler.py``: tasks -> ``prompts``)."""
