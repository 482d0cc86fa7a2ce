"""What to install for a missing part of TorchBurn.

TorchBurn's packages are installed from the wheels ``nox -s dist`` builds: the project that owns the name
``torchburn`` on PyPI is a different one, so a bare ``pip install torchburn`` fetches that instead.
"""

from __future__ import annotations

from ._version import __version__


def install_hint(extra: str | None = None) -> str:
    """The pip line that installs TorchBurn with ``extra`` (e.g. ``wgpu``), from TorchBurn's own wheels."""
    requirement = f"torchburn[{extra}]" if extra else "torchburn"
    return (
        f"pip install '{requirement}' from TorchBurn's wheels: "
        f"pip install --find-links dist '{requirement}=={__version__}' (after nox -s dist; "
        "the PyPI project named torchburn is another one)"
    )
