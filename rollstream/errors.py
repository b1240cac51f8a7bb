"""One flat exception hierarchy. Third-party errors are converted with ``raise ... from``."""


class RollstreamError(Exception):
    """Base of every error rollstream raises on purpose."""


class ConfigError(RollstreamError):
    """The configuration is wrong; the message names the key and what it accepts."""


class ModelError(RollstreamError):
    """A model or its tokenizer could not be found or loaded (rollstream/models.py)."""


class InfraError(RollstreamError):
    """Local infrastructure (broker, Redis, Docker) could not be started or reached."""


class KafkaError(RollstreamError):
    """Producing, consuming or administering topics failed after retries."""


class WeightStoreError(RollstreamError):
    """A weight version is missing, incomplete or corrupted; nothing was loaded."""


class SandboxError(RollstreamError):
    """The sandbox backend itself failed (not the code it ran)."""


class BackendError(RollstreamError):
    """A generation backend failed (model load, server unreachable, bad response)."""


class CheckpointError(RollstreamError):
    """A checkpoint is missing or inconsistent."""
