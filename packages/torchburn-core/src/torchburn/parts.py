"""Parts of TorchBurn that live in other packages, found through entry points so that core imports none
of them: ``torchburn.LLM`` (entry point ``LLM`` of group ``torchburn.parts``, from torchburn-llm) and
the LLM commands of ``python -m torchburn.llm`` (``llm_main``, from torchburn-cli). Another package can
provide either by declaring the same entry point."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from .install_hint import install_hint

GROUP = "torchburn.parts"


def load_part(name: str, what: str, extra: str) -> Any:
    """The object entry point ``name`` names; ``ImportError`` saying what to install when none does."""
    found = list(entry_points(group=GROUP, name=name))
    if not found:
        raise ImportError(f"{what}: {install_hint(extra)}")
    return found[0].load()
