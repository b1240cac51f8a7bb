"""rollstream: asynchronous RL post-training with execution feedback, as a Kafka stream.

This package holds only the wiring every stage shares: CLI, config, Kafka/Redis helpers,
the weight store, metrics and the local infrastructure.
"""

__version__ = "0.1.0"
