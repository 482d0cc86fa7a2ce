"""Kernel launches: a WGSL pipeline (compiled once per source text), the buffers it binds, its params.

Every kernel binds its small parameter block (sizes, strides, offsets as u32) at binding 0, the
buffer it writes at 1 and its inputs after. Launches name buffers by planner slot; the program binds
real buffers once, when it allocates them.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import shaders

WORKGROUPS_PER_DIM = 65535  # WebGPU's guaranteed minimum of max-compute-workgroups-per-dimension


@dataclass
class Launch:
    """One dispatch: ``family`` names the kernel file, ``source`` is the filled WGSL."""

    family: str
    source: str
    slots: list[int]  # buffers for bindings 1, 2, ... (the written one first)
    params: np.ndarray  # uint32 words for binding 0
    groups: tuple[int, int, int]
    writes: int = 1  # how many of ``slots``, from the first, the kernel writes


def f32_bits(x: float) -> int:
    """The IEEE-754 bits of ``x`` as float32, for params and for exact constants in WGSL."""
    bits: int = struct.unpack("<I", struct.pack("<f", x))[0]
    return bits


def f32_literal(x: float) -> str:
    """A WGSL expression that is exactly float32(x), infinities and NaN included."""
    return f"bitcast<f32>({f32_bits(x)}u)"


def grid(count: int) -> tuple[int, int, int]:
    """Workgroups for ``count`` independent items, spilling into y past the per-dimension limit
    (kernels compute the item as ``x + y * num_workgroups.x``)."""
    if count <= WORKGROUPS_PER_DIM:
        return (max(count, 1), 1, 1)
    rows = -(-count // WORKGROUPS_PER_DIM)
    return (WORKGROUPS_PER_DIM, rows, 1)


def params(words: Sequence[int]) -> np.ndarray:
    for w in words:
        if not 0 <= w < 2**32:
            raise ValueError(f"kernel parameter {w} does not fit 32 bits (tensor too large for this engine)")
    # a zero-length binding is not allowed: pad to one word
    return np.array(list(words) or [0], dtype=np.uint32)


class PipelineCache:
    """Compute pipelines by source text: the same kernel in many regions compiles once per device."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._pipelines: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.compiled = 0

    def get(self, source: str) -> Any:
        with self._lock:
            pipeline = self._pipelines.get(source)
            if pipeline is None:
                module = self.device.create_shader_module(code=source)
                pipeline = self.device.create_compute_pipeline(
                    layout="auto", compute={"module": module, "entry_point": "main"}
                )
                self._pipelines[source] = pipeline
                self.compiled += 1
            return pipeline


def elementwise_source(out_type: str, input_types: Sequence[str], rank: int, body: str) -> str:
    inputs = "\n".join(
        f"@group(0) @binding({2 + k}) var<storage, read> in{k}: array<{t}>;" for k, t in enumerate(input_types)
    )
    return shaders.source("elementwise", OUT_TYPE=out_type, INPUTS=inputs, RANK=str(rank), BODY=body)


# what each reduction folds with, starts from and finishes with (``total`` the folded value, ``n`` the count)
REDUCTIONS = {
    "sum": ("a + b", "0.0", "total"),
    "mean": ("a + b", "0.0", "total / f32(params[1])"),
    "amax": ("tb_max(a, b)", "-bitcast<f32>(0x7f800000u)", "total"),
    "amin": ("tb_min(a, b)", "bitcast<f32>(0x7f800000u)", "total"),
}


def reduce_source(kind: str, out_rank: int, red_rank: int) -> str:
    combine, init, finish = REDUCTIONS[kind]
    fills = {"OUT_RANK": str(out_rank), "RED_RANK": str(red_rank), "COMBINE": combine, "INIT": init, "FINISH": finish}
    return shaders.source("reduce", **fills)
