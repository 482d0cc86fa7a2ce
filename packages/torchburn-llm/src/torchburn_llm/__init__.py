"""TorchBurn's LLM runtime: ``torchburn.LLM.from_pretrained(folder)``."""

from __future__ import annotations

from ._version import __version__
from .architectures import Architecture, architecture_for
from .config import ModelConfig, RopeScaling
from .default_model import default_model_path
from .errors import ContextLengthError, ModelLoadError
from .llm import LLM
from .model import KVCache, Transformer

__all__ = [
    "LLM",
    "Architecture",
    "ContextLengthError",
    "KVCache",
    "ModelConfig",
    "ModelLoadError",
    "RopeScaling",
    "Transformer",
    "__version__",
    "architecture_for",
    "default_model_path",
]
