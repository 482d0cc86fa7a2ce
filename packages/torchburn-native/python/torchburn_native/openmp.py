"""Finding PyTorch's OpenMP runtime, so the native kernels run on the same threads as eager PyTorch.

Two thread pools on the same cores fight: each spins after its work while the other needs the core.
PyTorch's Linux wheels run intra-op work (and MKL) on GNU OpenMP, so the engine hands that runtime's
``GOMP_parallel`` to the Rust side and its parallel kernels join PyTorch's team. Anywhere else (no
libgomp mapped, another backend, ``TORCHBURN_THREAD_POOL=own``) the Rust side keeps its own pool.
"""

from __future__ import annotations

import sys

import torch

from .host_libs import loaded_libraries, symbol_address, torch_or_own

POOL_ENV = "TORCHBURN_THREAD_POOL"


def requested_pool() -> str:
    """``TORCHBURN_THREAD_POOL``: ``torch`` (default, share PyTorch's OpenMP team) or ``own``."""
    return torch_or_own(POOL_ENV)


def torch_gomp_parallel() -> int | None:
    """The address of ``GOMP_parallel`` in the libgomp PyTorch runs on, or None if it runs on none."""
    if not sys.platform.startswith("linux") or "OpenMP" not in torch.__config__.parallel_info():
        return None
    for lib in loaded_libraries("libgomp"):
        addr = symbol_address(lib, "GOMP_parallel")
        if addr:
            return addr
    return None
