"""Validation of ``torch.compile(..., options=...)`` and of TorchBurn's environment variables."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import OptionsError

FALLBACK_MODES = ("warn", "error", "silent")
CACHE_MODES = ("on", "memory", "off")
DEVICES = ("cpu", "gpu", "auto")


def _choice(what: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value.lower() not in allowed:
        raise OptionsError(f"{what} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value.lower()


@dataclass(frozen=True)
class CompileOptions:
    """Options of one ``torch.compile(backend="torchburn")`` call, validated.

    engine: engine name or alias; ``None`` picks ``torchburn.active_engine()``.
    fallback: what to do with nodes the engine does not support: warn once per op, raise, or stay silent.
    cache: ``on`` (memory + disk), ``memory`` (this process only) or ``off``.
    verbose: log the partition and each region's cache key at INFO level.
    """

    engine: str | None = None
    fallback: str = "warn"
    cache: str = "on"
    verbose: bool = False

    def key_items(self) -> tuple[tuple[str, str], ...]:
        """The options as sorted ``(name, value)`` pairs, for the graph cache key."""
        return tuple(sorted((k, repr(v)) for k, v in self.__dict__.items()))


_VALIDATORS: dict[str, Callable[[Any], Any]] = {
    "engine": lambda v: _engine_name(v),
    "fallback": lambda v: _choice('options["fallback"]', v, FALLBACK_MODES),
    "cache": lambda v: _choice('options["cache"]', v, CACHE_MODES),
    "verbose": lambda v: _bool('options["verbose"]', v),
}


def _engine_name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise OptionsError(f'options["engine"] must be an engine name (a string); got {value!r}')
    return value


def _bool(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise OptionsError(f"{what} must be True or False; got {value!r}")
    return value


def parse_options(options: Mapping[str, Any] | None) -> CompileOptions:
    """Validate user options; unknown keys and bad values raise ``OptionsError`` listing what is allowed."""
    if options is None:
        return CompileOptions()
    if not isinstance(options, Mapping):
        raise OptionsError(f"options must be a dict; got {type(options).__name__}")
    unknown = sorted(set(options) - set(_VALIDATORS))
    if unknown:
        raise OptionsError(
            f"unknown torchburn option(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(map(repr, _VALIDATORS))}"
        )
    checked: dict[str, Any] = {k: _VALIDATORS[k](v) for k, v in options.items()}
    return CompileOptions(**checked)


def env_choice(name: str, allowed: tuple[str, ...]) -> str | None:
    """Read an environment variable that must be one of ``allowed`` (case-insensitive); unset or empty is None."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    return _choice(f"environment variable {name}", raw, allowed)
