"""Fixtures for the native CPU engine's tests: which engine to run, strict compile, proof the engine ran.

These tests are for the ``native`` engine (alias ``native_cpu``, package ``torchburn_native``). When it is
not installed they FAIL, on purpose: the native engine is a core feature, not an optional one. Setting
``TORCHBURN_TEST_ALLOW_REFERENCE=1`` runs them on the ``reference`` engine instead (to develop the tests
themselves before the engine exists); the tests of the native-only debugging API then skip.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

import torchburn
from helpers import assert_engine_ran as assert_ran
from helpers import strict_compile

ALLOW_REFERENCE = "TORCHBURN_TEST_ALLOW_REFERENCE"


def _choose_engine() -> tuple[str, str | None]:
    """(engine to test, why the tests must fail instead): native if available, else reference if allowed."""
    rows = [row for row in torchburn.list_engines() if row.name == "native" or "native" in row.aliases]
    if any(row.available for row in rows):
        return "native", None
    if os.environ.get(ALLOW_REFERENCE) == "1":
        return "reference", None
    if rows:
        why = "is installed but unavailable: " + "; ".join(str(row.reason) for row in rows)
    else:
        why = "is not installed (torchburn.list_engines() has no 'native' engine; package torchburn_native)"
    return "native", (
        f"the native engine {why}. Build and install packages/torchburn-native (maturin develop), "
        f"or set {ALLOW_REFERENCE}=1 to run these tests on the reference engine."
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A test that needs the engine FAILS (not skips, not errors) when the native engine is missing."""
    if "engine_name" in getattr(item, "fixturenames", ()):
        _, failure = _choose_engine()
        if failure is not None:
            pytest.fail(failure, pytrace=False)


@pytest.fixture
def engine_name() -> str:
    """ "native" when it is installed and available; "reference" only if TORCHBURN_TEST_ALLOW_REFERENCE=1.

    Without either, every test using this fixture fails in pytest_runtest_call above, before its body runs.
    """
    return _choose_engine()[0]


@pytest.fixture
def compile_engine(engine_name: str) -> Callable[..., Any]:
    """``compile_engine(fn, **compile_kwargs)``: torch.compile on the engine under test, fallback="error"."""
    return strict_compile(engine_name)


@pytest.fixture
def assert_engine_ran(engine_name: str) -> Callable[..., None]:
    """``assert_engine_ran(min_nodes=1)``: the engine ran at least that many graph nodes, none fell back."""
    canonical = torchburn.get_engine(engine_name).name  # "native_cpu" counts as "native"
    return functools.partial(assert_ran, canonical)
