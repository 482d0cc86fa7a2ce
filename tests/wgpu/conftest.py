"""Fixtures for the GPU engine's tests. They run on whatever adapter wgpu picks: Mesa's software
Vulkan (lavapipe) in CI, a real GPU elsewhere. Without an adapter they FAIL (the engine is a feature
of the project, not an optional extra of the test run) with the reason the engine gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchburn
from helpers import engine_counts


def _unavailable() -> str | None:
    rows = [row for row in torchburn.list_engines() if row.name == "wgpu"]
    if not rows:
        return "the wgpu engine is not installed (pip install ./packages/torchburn-wgpu)"
    if not rows[0].available:
        return f"the wgpu engine is unavailable: {rows[0].reason} (CI installs mesa-vulkan-drivers for one)"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if "gpu_compile" in getattr(item, "fixturenames", ()):
        why = _unavailable()
        if why is not None:
            pytest.fail(why, pytrace=False)


@pytest.fixture
def gpu_compile() -> Callable[..., Any]:
    """``gpu_compile(fn)``: torch.compile on the wgpu engine in strict mode (a fallback is an error)."""
    torchburn.reset_coverage()

    def compile_(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        return torch.compile(fn, backend="torchburn", options={"engine": "wgpu", "fallback": "error"}, **kwargs)

    return compile_


@pytest.fixture
def assert_gpu_ran() -> Callable[..., None]:
    """``assert_gpu_ran(min_nodes)``: the engine ran at least that many nodes and none fell back."""

    def check(min_nodes: int = 1) -> None:
        ran, fell = engine_counts("wgpu")
        assert fell == 0 and ran >= min_nodes, torchburn.format_coverage()

    return check
