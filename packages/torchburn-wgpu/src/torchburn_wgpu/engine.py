"""The ``wgpu`` engine (alias ``burn-wgpu``): registration, support decisions and compilation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchburn import composites, convolution_3d
from torchburn.engines.base import Availability, Engine, NodeSpec, Program, Region
from torchburn.fastpaths import FAST_PATHS
from torchburn.hookspecs import hookimpl

from . import __version__
from .device import DeviceUnavailable, gpu, requested_backend
from .lowering import OPS, keep_whole
from .program import CompiledRegion
from .values import SUPPORTED_DTYPES, element_bytes, numel

aten = torch.ops.aten


class WgpuEngine(Engine):
    name = "wgpu"
    aliases = ("burn-wgpu",)
    device = "gpu"
    version = __version__
    priority = 10  # below the CPU default: a GPU is picked by name or TORCHBURN_DEVICE=gpu
    ops = OPS

    def availability(self) -> Availability:
        try:
            requested_backend()
            device = gpu()
            software = device.adapter.info.get("adapter_type") == "CPU"
            return Availability(True, device_name=device.name, emulated=software)
        except (DeviceUnavailable, ValueError) as exc:
            return Availability(False, reason=str(exc))

    def keep_whole(self) -> frozenset[Any]:
        return keep_whole()

    def extra_decompositions(self) -> dict[Any, Callable[..., Any]]:
        # its convolution kernels are 1-D and 2-D: 3-D ones become sums of 2-D ones; its scatter
        # combines into the written positions only
        return {
            **FAST_PATHS,
            **convolution_3d.DECOMPOSITIONS,
            aten.scatter_reduce.two: composites.scatter_reduce_by_parts,
        }

    def supports(self, node: NodeSpec) -> bool | str:
        device = gpu()
        for spec in (*node.inputs, *node.outputs):
            if spec is None:
                continue
            if spec.dtype not in SUPPORTED_DTYPES:
                return f"dtype {spec.dtype} not supported (supported: float32, float64, float16, int64, int32, bool)"
            if spec.dtype == torch.float64 and not device.f64:
                return "float64 needs an adapter with shader-f64, which this one lacks"
            if spec.dtype == torch.float16 and not device.f16:
                return "float16 needs an adapter with shader-f16, which this one lacks"
            if spec.is_dynamic:
                continue
            limit = device.max_binding_bytes
            nbytes = numel([int(s) for s in spec.shape]) * element_bytes(spec.dtype)
            if nbytes > limit:
                return f"a tensor of {nbytes} bytes exceeds the adapter's largest storage binding ({limit} bytes)"
        return self.ops.supports(node)

    def compile(self, region: Region) -> Program:
        device = gpu()  # raises DeviceUnavailable with the reason
        strides = [spec.stride if spec is not None else None for spec in region.outputs]
        return CompiledRegion(device, region.graph_module, strides)

    def cache_key_parts(self) -> dict[str, str]:
        try:
            return {"adapter": gpu().name}
        except DeviceUnavailable:
            return {"adapter": "none"}


@hookimpl
def register_engines(register: Callable[[Engine], None]) -> None:
    register(WgpuEngine())
