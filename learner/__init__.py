"""The off-policy GRPO learner (``learner/train.py``: ``advantages`` -> optimizer steps, checkpoints
and weights broadcast through Redis) and its pure loss."""
