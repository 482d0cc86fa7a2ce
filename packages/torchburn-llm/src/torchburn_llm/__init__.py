"""TorchBurn's LLM runtime: ``torchburn.LLM.from_pretrained(folder)``.

``LLM``, ``KVCache`` and ``Transformer`` load on first use: the package is also imported as a plugin of
every ``torch.compile`` (for its architectures), which must not pay for the chat templating and the
weight loaders.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .architectures import Architecture, architecture_for
from .config import ModelConfig, RopeScaling
from .default_model import default_model_path
from .errors import ContextLengthError, ModelLoadError

if TYPE_CHECKING:
    from .llm import LLM
    from .model import KVCache, Transformer

_LAZY = {"LLM": ".llm", "KVCache": ".model", "Transformer": ".model"}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
