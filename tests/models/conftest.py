"""Whole-model tests run on every complete engine the project ships, each in strict mode.

An engine that is not installed or not available here FAILS its tests with the reason (both are
features of the project: CI installs a software Vulkan driver for the GPU engine).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import torchburn
from helpers import assert_engine_ran as assert_ran
from helpers import strict_compile

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
    return strict_compile(engine_name)


@pytest.fixture
def assert_engine_ran(engine_name: str) -> Callable[..., None]:
    """``assert_engine_ran(min_nodes=1)``: the engine ran at least that many nodes, none fell back."""
    return functools.partial(assert_ran, engine_name)
