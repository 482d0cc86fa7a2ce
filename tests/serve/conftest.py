"""Servers for the tests (see :mod:`serve_process`) and the same model in this process as their ground truth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serve_process import ServerProcess
from torchburn_llm import LLM


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on the shipped SmolLM2 for the whole session (its defaults, no key)."""
    proc = ServerProcess([], tmp_path_factory.mktemp("serve") / "server.log")
    yield proc
    proc.stop()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start a server with its own options; stopped after the test."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        proc = ServerProcess(list(args), tmp_path / f"server-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def llm() -> LLM:
    """The shipped model in this process: the ground truth the server's answers are checked against."""
    return LLM.from_pretrained()
