"""Exceptions raised by TorchBurn.

``FallbackError`` lives in :mod:`torchburn._fallback_error` because it derives from a Dynamo exception
and importing Dynamo costs seconds; ``torchburn.FallbackError`` loads it on first access.
"""

from __future__ import annotations


class TorchBurnError(Exception):
    """Base class of every error TorchBurn raises on purpose."""


class OptionsError(TorchBurnError, ValueError):
    """An option or environment variable has a value TorchBurn does not accept."""


class EngineNotFoundError(TorchBurnError, LookupError):
    """No installed engine has the requested name."""


class EngineUnavailableError(TorchBurnError, RuntimeError):
    """The engine is installed but cannot run here (no device, missing library, ...)."""


class TorchBurnFallbackWarning(UserWarning):
    """An op ran in PyTorch eager because the engine does not support it (warned once per op)."""


class CacheCorruptionWarning(UserWarning):
    """An on-disk cache entry failed verification and was ignored; it is rebuilt."""
