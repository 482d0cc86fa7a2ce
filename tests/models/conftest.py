"""Whole-model tests run on every complete engine the project ships, each in strict mode.

An engine that is not installed or not available here FAILS its tests with the reason (both are
features of the project: CI installs a software Vulkan driver for the GPU engine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchburn
from helpers import engine_counts

ENGINES = ["native", "wgpu"]


@pytest.fixture(params=ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    rows = [row for row in torchburn.list_engines() if row.name == name]
    if not rows:
        pytest.fail(f"engine {name!r} is not installed", pytrace=False)
    if not rows[0].available:
        pytest.fail(f"engine {name!r} is unavailable here: {rows[0].reason}", pytrace=False)
    torchburn.reset_coverage()
    return name


@pytest.fixture
def compile_engine(engine_name: str) -> Callable[..., Any]:
    """``compile_engine(fn)``: torch.compile on the engine under test, fallback="error"."""

    def compile_(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        options = {"engine": engine_name, "fallback": "error"}
        return torch.compile(fn, backend="torchburn", options=options, **kwargs)

    return compile_


@pytest.fixture
def assert_engine_ran(engine_name: str) -> Callable[..., None]:
    """``assert_engine_ran(min_nodes=1)``: the engine ran at least that many nodes, none fell back."""

    def check(min_nodes: int = 1) -> None:
        ran, fell = engine_counts(engine_name)
        report = torchburn.format_coverage()
        assert fell == 0, f"{fell} node(s) fell back to eager:\n{report}"
        assert ran >= min_nodes, f"engine {engine_name!r} ran {ran} node(s), expected >= {min_nodes}:\n{report}"

    return check
