"""The hooks a TorchBurn plugin may implement (pluggy project ``torchburn``).

A plugin is a module named by an entry point in the ``torchburn`` group; it implements hooks with
``@torchburn.hookimpl``. Every hook receives a callback (or app) and calls it; none returns a value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("torchburn")
hookimpl = pluggy.HookimplMarker("torchburn")


@hookspec
def register_engines(register: Callable[[Any], None]) -> None:
    """Register compile engines: call ``register(engine)`` with an instance of ``torchburn.Engine``."""


@hookspec
def register_models(register: Callable[[Any], None]) -> None:
    """Register LLM architecture specs for ``torchburn.LLM``: call ``register(spec)`` for each."""


@hookspec
def register_commands(app: Any) -> None:
    """Add sub-commands to the ``torchburn`` command line: ``app`` is its typer application."""
