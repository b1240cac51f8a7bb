"""The evaluator: held-out pass@k of the versions a run publishes, and the episode player that
``rollstream eval`` shares with it (it sits above the stages: it generates and it executes)."""
