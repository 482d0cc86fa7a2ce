"""What the LLM runtime raises for bad models and bad requests: each message says what was wrong."""

from __future__ import annotations

from torchburn.errors import TorchBurnError


class ModelLoadError(TorchBurnError):
    """A checkpoint cannot be loaded: unknown architecture, missing or unexpected tensors, bad config."""


class ChatTemplateError(ModelLoadError, ValueError):
    """A model's chat template cannot render: a syntax or runtime error, or a limit it ran into (time, size,
    depth). A ValueError too, as template failures always were."""


class ContextLengthError(TorchBurnError, ValueError):
    """A prompt (plus the tokens to generate) does not fit the model's context or the KV cache."""


class PeerUnavailableError(TorchBurnError, RuntimeError):
    """A comparison asks for another runtime (llama.cpp) that is not installed; the message says how to
    install it."""
