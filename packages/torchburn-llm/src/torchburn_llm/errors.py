"""What the LLM runtime raises for bad models and bad requests: each message says what was wrong."""

from __future__ import annotations

from torchburn.errors import TorchBurnError


class ModelLoadError(TorchBurnError):
    """A checkpoint cannot be loaded: unknown architecture, missing or unexpected tensors, bad config."""


class ContextLengthError(TorchBurnError, ValueError):
    """A prompt (plus the tokens to generate) does not fit the model's context or the KV cache."""
