"""The ``torchburn`` command line (see ``torchburn --help``)."""

from ._version import __version__

__all__ = ["__version__"]
