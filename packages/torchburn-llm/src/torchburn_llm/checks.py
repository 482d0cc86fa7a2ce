"""Numbers read from model files, checked before anything is sized by them.

A config or GGUF header is untrusted: a head count of 0, a layer count of a billion, ``"64"`` or ``64.5``
where a size goes, or a boolean where a number goes must be a one-line error naming the field, never a
ZeroDivisionError deep in the loader or a loop that allocates for minutes. The upper bounds are far above
any released model and only keep a crafted file from sizing work by an absurd number.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ModelLoadError

MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_WIDTH = 1 << 20  # hidden size, head size, MLP width
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 28


def shown(value: Any, limit: int = 40) -> str:
    """``value`` as the error message shows it: its repr, on one line and cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def whole(value: Any, key: str, source: str, low: int = 1, high: int = MAX_WIDTH) -> int:
    """``value`` as an int in [low, high]; booleans, floats (64.5 and 64.0 alike) and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"{source}: {key} must be a whole number, got {shown(value)}")
    if not low <= value <= high:
        raise ModelLoadError(f"{source}: {key} must be between {low} and {high}, got {value}")
    return value


def real(value: Any, key: str, source: str, low: float = 0.0, high: float = math.inf, *, above: bool = True) -> float:
    """``value`` as a finite float in (low, high] (``above=False``: [low, high]); ints are fine, booleans,
    strings, NaN and infinities are not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelLoadError(f"{source}: {key} must be a number, got {shown(value)}")
    number = float(value) if abs(value) < 1e308 else math.inf  # an int too large for a float is no size
    if not math.isfinite(number) or number > high or number < low or (above and number == low):
        bounds = f"{'above' if above else 'at least'} {low:g}" + (f" and at most {high:g}" if high < math.inf else "")
        raise ModelLoadError(f"{source}: {key} must be a finite number {bounds}, got {shown(value)}")
    return number


def flag(value: Any, key: str, source: str, default: bool = False) -> bool:
    """``value`` as a bool (absent or null: ``default``); ``"false"`` is not False, so strings are refused."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ModelLoadError(f"{source}: {key} must be true or false, got {shown(value)}")
    return value


def text(value: Any, key: str, source: str) -> str:
    if not isinstance(value, str):
        raise ModelLoadError(f"{source}: {key} must be a string, got {shown(value)}")
    return value


def token_ids(value: Any, key: str, source: str, vocab: int) -> tuple[int, ...]:
    """A token id or a list of them (null: none), each in [0, vocab)."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if len(values) > 1024:
        raise ModelLoadError(f"{source}: {key} lists {len(values)} token ids; at most 1024 are read")
    return tuple(whole(v, key, source, 0, vocab - 1) for v in values)


def token_id(value: Any, key: str, source: str, vocab: int) -> int | None:
    return None if value is None else whole(value, key, source, 0, vocab - 1)
