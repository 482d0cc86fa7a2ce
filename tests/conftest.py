"""Shared fixtures: every test gets its own cache dir and a fresh Dynamo / coverage / cache state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torchburn


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private TORCHBURN_CACHE_DIR and data dir, no engine env vars, and nothing left from earlier tests."""
    cache = tmp_path / "tb-cache"
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(cache))
    # the per-user secret that authenticates cache entries lives in the user data dir: a private one
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "tb-data"))
    for var in ("TORCHBURN_ENGINE", "TORCHBURN_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    torch._dynamo.reset()
    torchburn.reset_coverage()
    torchburn.clear_cache(disk=False)
    yield cache
    torch._dynamo.reset()
