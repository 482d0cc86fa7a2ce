"""Sessions: ``nox -s demo`` (main job), ``nox -s tests``, ``nox -s lint``.

Virtualenvs are made by uv, which keeps one copy of torch in its cache and links it into each session,
so a second run installs in seconds.
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_venv = "yes"

PYTHON = "3.11"
TORCH = "torch>=2.5"
PACKAGES = ["./packages/torchburn-core", "./packages/torchburn"]
TEST_PLUGIN = "./tests/plugins/torchburn-tiny-engine"


def _env() -> dict[str, str]:
    # torch builds for CUDA; these machines have none, so keep it from probing
    return {"CUDA_VISIBLE_DEVICES": "", "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp")}


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Install every package (not editable, as users get them) and run the whole test suite."""
    session.install(TORCH, "numpy", "pytest>=8", "packaging")
    session.install(*PACKAGES, TEST_PLUGIN)
    session.run("pytest", *(session.posargs or ["-q"]), env=_env())


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff format + check, and mypy --strict on the packages."""
    # pinned: a new ruff or mypy release must not turn a green main red
    session.install("ruff==0.17.6", "mypy==2.4.1", TORCH, "pluggy", "blake3", "platformdirs")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")
    session.run("mypy")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The main job: compile a model with TorchBurn and show what ran where."""
    session.install(TORCH, *PACKAGES)
    session.run("python", "examples/compile_demo.py", env=_env())
