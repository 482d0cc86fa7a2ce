"""TorchBurn: a ``torch.compile`` backend with pluggable engines, and a local LLM runtime.

fast = torch.compile(model, backend="torchburn", options={"engine": "native", "fallback": "warn"})
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .cache import cache_info, clear_cache
from .engines.base import Availability, Engine, NodeSpec, Region, TensorSpec
from .engines.discovery import EngineInfo, active_engine, get_engine, list_engines
from .errors import (
    CacheCorruptionWarning,
    EngineNotFoundError,
    EngineUnavailableError,
    OptionsError,
    TorchBurnError,
    TorchBurnFallbackWarning,
)
from .hookspecs import hookimpl
from .ops import OpRegistry
from .telemetry import coverage, format_coverage, reset_coverage

if TYPE_CHECKING:
    from ._fallback_error import FallbackError
    from .optable import engine_ops, format_engine_ops

__all__ = [
    "engine_ops",
    "format_engine_ops",
    "__version__",
    "Availability",
    "CacheCorruptionWarning",
    "Engine",
    "EngineInfo",
    "EngineNotFoundError",
    "EngineUnavailableError",
    "FallbackError",
    "NodeSpec",
    "OpRegistry",
    "OptionsError",
    "Region",
    "TensorSpec",
    "TorchBurnError",
    "TorchBurnFallbackWarning",
    "active_engine",
    "cache_info",
    "clear_cache",
    "coverage",
    "format_coverage",
    "get_engine",
    "hookimpl",
    "list_engines",
    "reset_coverage",
]


def __getattr__(name: str) -> Any:
    # FallbackError derives from a Dynamo exception; importing Dynamo takes seconds, so load it on demand.
    if name == "FallbackError":
        from ._fallback_error import FallbackError

        return FallbackError
    # loaded on demand so that ``python -m torchburn.optable`` runs the module fresh
    if name in ("engine_ops", "format_engine_ops"):
        from . import optable

        return getattr(optable, name)
    if name == "LLM":  # from torchburn-llm, through its entry point (see torchburn.parts)
        from .parts import load_part

        return load_part("LLM", "torchburn.LLM needs the LLM runtime (torchburn-llm)", "llm")
    raise AttributeError(f"module 'torchburn' has no attribute {name!r}")
