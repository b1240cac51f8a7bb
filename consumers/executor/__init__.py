"""The executor stage: ``actions`` -> ``rewards`` + ``audit`` (stage.py), its Docker sandbox pool,
reward rules and reference checks, and the in-container runtime (runtime/)."""
