"""Finding the MKL inside PyTorch, so the native engine's GEMMs run on the same micro-kernels as eager.

PyTorch's x86 Linux wheels link MKL into ``libtorch_cpu`` and export its Fortran ``sgemm_`` and
``dgemm_``. Handing those to the Rust side makes each block product of a GEMM an MKL call, while the
blocking across threads, the fused bias and activation epilogues and everything around the GEMM stay
the engine's own. Anywhere else (no MKL in the process, ``TORCHBURN_BLAS=own``) the `gemm` crate
computes them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from .host_libs import loaded_libraries, symbol_address, torch_or_own

BLAS_ENV = "TORCHBURN_BLAS"


def requested_blas() -> str:
    """``TORCHBURN_BLAS``: ``torch`` (default, PyTorch's MKL when it has one) or ``own`` (the gemm crate)."""
    return torch_or_own(BLAS_ENV)


@dataclass(frozen=True)
class HostBlas:
    """Addresses of the MKL routines the engine calls."""

    sgemm: int
    dgemm: int
    set_local_threads: int
    # f32 products from a B packed once per version of B (0 where this MKL lacks them)
    sgemm_pack_get_size: int
    sgemm_pack: int
    sgemm_compute: int


def torch_mkl() -> HostBlas | None:
    """The MKL routines linked into this process's PyTorch, or None where it has no MKL."""
    if not sys.platform.startswith("linux") or not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
        return None
    for lib in loaded_libraries("libtorch_cpu"):
        found = HostBlas(
            *(
                symbol_address(lib, s)
                for s in (
                    "sgemm_",
                    "dgemm_",
                    "MKL_Set_Num_Threads_Local",
                    "cblas_sgemm_pack_get_size",
                    "cblas_sgemm_pack",
                    "cblas_sgemm_compute",
                )
            )
        )
        # without the thread-local setting MKL would start its own team inside each of ours
        if found.sgemm and found.set_local_threads:
            return found
    return None
