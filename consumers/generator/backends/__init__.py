"""Generation backends: the interface (``base``), the sampling math (``sampling``), the local
transformers loop (``hf``) and the SGLang HTTP client (``sglang``).

Import the concrete backends from their modules; this package only re-exports the interface,
so importing it stays cheap (no torch)."""

from rollstream.consumers.generator.backends.base import (
    Completion,
    GenerationBackend,
    GenerationRequest,
    Sampling,
)

__all__ = ["Completion", "GenerationBackend", "GenerationRequest", "Sampling"]
