"""TorchBurn's OpenAI-compatible server: ``torchburn serve``, or ``create_app(llm, name)`` for any ASGI
server. Chat and text completions (streamed or whole), embeddings, models, health, and a chat page at
``/``; requests share one continuously batched decode loop."""

from __future__ import annotations

from ._version import __version__
from .app import create_app
from .limits import Limits
from .server import run

__all__ = ["Limits", "__version__", "create_app", "run"]
