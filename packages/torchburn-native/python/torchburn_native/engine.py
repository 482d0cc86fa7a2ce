"""The ``native`` engine: registration, support decisions and compilation for TorchBurn core."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from torchburn import convolution_3d
from torchburn.engines.base import Availability, Engine, NodeSpec, Program, Region
from torchburn.fastpaths import FAST_PATHS
from torchburn.hookspecs import hookimpl

from . import __version__, _native
from .host_blas import requested_blas, torch_mkl
from .lowering import OPS
from .openmp import requested_pool, torch_gomp_parallel
from .program import CompiledRegion
from .runtime import plan_context
from .values import SUPPORTED_DTYPES

aten = torch.ops.aten


def configured_threads() -> int:
    """``TORCHBURN_NUM_THREADS``, else PyTorch's intra-op thread count."""
    raw = os.environ.get("TORCHBURN_NUM_THREADS")
    if raw:
        try:
            n = int(raw)
        except ValueError:
            raise ValueError(f"TORCHBURN_NUM_THREADS must be a positive integer, got {raw!r}") from None
        if n < 1:
            raise ValueError(f"TORCHBURN_NUM_THREADS must be a positive integer, got {raw!r}")
        return n
    return torch.get_num_threads()


_threads_ready = False


def _follow_eager_specials() -> None:
    """Special values where PyTorch's own CPU kernels differ by ISA: the engine gives what eager gives
    in this process. GELU(+inf) is NaN from the AVX-512 kernel and +inf from the AVX2 one; the probe is
    long enough to take the vectorized path."""
    probe = torch.nn.functional.gelu(torch.full((64,), float("inf")))
    _native.set_gelu_positive_infinity_nan(bool(torch.isnan(probe[0])))


def _check_isa_request() -> None:
    ignored = _native.isa_status()["ignored"]
    if ignored:
        warnings.warn(f"torchburn-native: {ignored}; running at the CPU's own level", RuntimeWarning, stacklevel=3)


def host_blas_matches_isa() -> bool:
    """Whether PyTorch's MKL may compute GEMMs: always at the CPU's own level; under a lower
    ``TORCHBURN_ISA`` only when ``MKL_ENABLE_INSTRUCTIONS`` holds MKL down too, since otherwise MKL
    would still run its widest kernels and the products would not be the capped level's."""
    status = _native.isa_status()
    return status["level"] == status["detected"] or bool(os.environ.get("MKL_ENABLE_INSTRUCTIONS"))


def ensure_threads() -> int:
    global _threads_ready
    if not _threads_ready:
        _check_isa_request()
        _follow_eager_specials()
        _native.init_threads(configured_threads())
        if requested_pool() == "torch":
            addr = torch_gomp_parallel()
            if addr is not None:
                _native.share_openmp(addr)
        if requested_blas() == "torch" and host_blas_matches_isa():
            mkl = torch_mkl()
            if mkl is not None:
                _native.share_host_blas(mkl.sgemm, mkl.dgemm, mkl.set_local_threads)
                _native.share_host_packing(mkl.sgemm_pack_get_size, mkl.sgemm_pack, mkl.sgemm_compute)
        _threads_ready = True
    return int(_native.num_threads())


class NativeEngine(Engine):
    name = "native"
    aliases = ("native_cpu",)
    device = "cpu"
    version = __version__
    priority = 100
    ops = OPS

    def availability(self) -> Availability:
        threads = ensure_threads()
        status = _native.isa_status()
        level = status["level"]
        if level != status["detected"]:
            level += f" (TORCHBURN_ISA; the CPU runs {status['detected']})"
        return Availability(True, device_name=f"CPU (ISA {level}, {threads} threads, GEMM on {_native.gemm_backend()})")

    def keep_whole(self) -> frozenset[Any]:
        # implemented as fused kernels: decomposing them would cost extra memory sweeps
        keep = {
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten.hardswish.default,
            aten.hardsigmoid.default,
        }
        keep |= {aten.silu.default, aten.gelu.default, aten.native_layer_norm.default}
        # inference batch norm: its decomposition costs a quarter of a second of AOT tracing on a
        # ResNet-18 and plans to the same scale-and-shift chain the lowering emits directly
        keep.add(aten._native_batch_norm_legit_no_training.default)
        # upsampling: one pass over the output instead of four gathers and a blend
        keep |= {aten.upsample_bilinear2d.default, aten.upsample_nearest2d.default}
        keep.add(aten._upsample_nearest_exact2d.default)
        return frozenset(keep)

    def extra_decompositions(self) -> dict[Any, Callable[..., Any]]:
        # its convolution kernels are 1-D and 2-D: 3-D ones become sums of 2-D ones
        return {**FAST_PATHS, **convolution_3d.DECOMPOSITIONS}

    def supports(self, node: NodeSpec) -> bool | str:
        for spec in (*node.inputs, *node.outputs):
            if spec is not None and spec.dtype not in SUPPORTED_DTYPES:
                return f"dtype {spec.dtype} not supported"
        return self.ops.supports(node)

    def compile(self, region: Region) -> Program:
        ensure_threads()
        compiled = CompiledRegion(region.graph_module, plan_context())
        with unset_fake_temporarily():
            static = [_example(spec) for spec in region.inputs]
        if all(a is not None for a in static):
            compiled.prepare(static)  # plan now so that a planning error surfaces at compile time
        return compiled

    def cache_key_parts(self) -> dict[str, str]:
        return {"isa": _native.isa()}


def _example(spec: Any) -> Any:
    """A meta-free stand-in with the spec's shape and strides, for planning static regions up front."""
    if spec is None or spec.is_dynamic:
        return None
    return torch.empty_strided(spec.shape, spec.stride, dtype=spec.dtype)


@hookimpl
def register_engines(register: Callable[[Engine], None]) -> None:
    register(NativeEngine())
