"""JSON from outside (request bodies, tool-call arguments, the model's own answers) read without
letting its nesting reach Python's recursion limit: a body of a hundred thousand ``[`` is a 400, not a
``RecursionError`` deep inside the server."""

from __future__ import annotations

import json
from typing import Any

# levels of arrays and objects a value may nest: a chat request needs fewer than ten, a JSON schema
# for structured output a few dozen
MAX_NESTING = 64


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, or ``ValueError`` (``json.JSONDecodeError`` for text that is not JSON,
    ``UnicodeDecodeError`` for bytes that are not UTF-8) where the text is not JSON or nests deeper
    than :data:`MAX_NESTING`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"the JSON nests deeper than {MAX_NESTING} levels") from None
    if _depth(value) > MAX_NESTING:
        raise ValueError(f"the JSON nests deeper than {MAX_NESTING} levels")
    return value


def _depth(value: Any) -> int:
    """How many arrays and objects deep ``value`` goes (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if level <= MAX_NESTING:  # past the limit the answer is known
            stack.extend((child, level + 1) for child in children)
    return deepest
