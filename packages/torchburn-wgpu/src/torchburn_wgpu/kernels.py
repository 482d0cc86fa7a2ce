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


def register_block(element: str, extra: str, size: int = 8) -> dict[str, str]:
    """The ``size``×``size`` (8 or 4) register block of the tiled product kernels, written out: one
    named variable per accumulator, the multiply-adds per step along k and the stores (``put(row, col,
    <extra>)``), since GPU compilers put an indexed array in slow local memory instead of registers.
    Rows of a thread: 4·ly .. 4·ly+3, and with 8 also those 64 further on; columns likewise with lx."""
    halves = ("lo", "hi")[: size // 4]
    declare = "\n".join(f"    var c_{i}_{j} = {element}(0);" for i in range(size) for j in range(size))
    # one step along k: this thread's values of A and of B (one vec4 per half, from the staged tiles),
    # then the multiply-adds
    reads = []
    for h, half in enumerate(halves):
        reads += [
            f"            let a_{half} = a_tile[kk * A_ROW + {16 * h}u + lid.y];",
            f"            let b_{half} = b_tile[kk * B_ROW + {16 * h}u + lid.x];",
        ]
    update = "\n".join(
        reads
        + [
            f"            c_{i}_{j} = fma(a_{halves[i // 4]}[{i % 4}], b_{halves[j // 4]}[{j % 4}], c_{i}_{j});"
            for i in range(size)
            for j in range(size)
        ]
    )
    store = "\n".join(
        f"    put(row0 + {64 * (i // 4) + i % 4}u + lid.y * 4u, col0 + {64 * (j // 4) + j % 4}u + lid.x * 4u, "
        f"{extra.format(f'c_{i}_{j}')});"
        for i in range(size)
        for j in range(size)
    )
    return {"ACC_DECLARE": declare, "ACC_UPDATE": update, "ACC_STORE": store}


# how ``matmul.wgsl`` stages B: element by element, vec4 along n (row-major), vec4 along k
B_STRIDED, B_VEC_ALONG_N, B_VEC_ALONG_K = 0, 1, 2


def matmul_source(element: str, a_vec: bool, b_mode: int, tile: int = 128) -> str:
    """``matmul.wgsl`` for ``element`` (f32, f64 or f16: f16 accumulates in f32); ``a_vec``: A read as
    vec4 along k (row-major, aligned); ``b_mode``: one of ``B_STRIDED``, ``B_VEC_ALONG_N``,
    ``B_VEC_ALONG_K``; ``tile``: 128 or 64 rows and columns of C per workgroup."""
    if tile not in (64, 128):
        raise ValueError(f"matmul tile {tile}: 64 or 128")
    acc = "f32" if element == "f16" else element
    block = register_block(acc, "wg.z, batch, {}, alpha, beta", tile // 16)
    flags = {"A_VEC": "true" if a_vec else "false", "B_MODE": str(b_mode), "TILE": str(tile)}
    text = shaders.source("matmul", TYPE=element, ACC=acc, **flags, **block)
    return with_f16(text) if element == "f16" else text


def with_f16(text: str) -> str:
    """WGSL that uses f16 must say so before anything else."""
    return "enable f16;\n" + text


def conv_source() -> str:
    return shaders.source("conv", **register_block("f32", "g, plane, {}"))


# scans: (combine or takes-over test, identity) by op, for float and for integer accumulators
SCANS: dict[str, dict[str, tuple[str, str]]] = {
    "sum": {"f32": ("a + b", "0.0"), "i32": ("a + b", "0i")},
    "prod": {"f32": ("a * b", "1.0"), "i32": ("a * b", "1i")},
    "logsumexp": {"f32": ("log_add_exp(a, b)", "-bitcast<f32>(0x7f800000u)")},
    "max": {"f32": ("tb_isnan(b) || (!tb_isnan(a) && b >= a)", "0.0"), "i32": ("b >= a", "0i")},
    "min": {"f32": ("tb_isnan(b) || (!tb_isnan(a) && b <= a)", "0.0"), "i32": ("b <= a", "0i")},
}
SCAN_LOADS = {("f32", "f32"): "v", ("i32", "f32"): "f32(v)", ("u32", "f32"): "f32(v)", ("i32", "i32"): "v"}
SCAN_LOADS[("u32", "i32")] = "i32(v)"
# lines up to this long are scanned by one thread each; longer ones by a workgroup
SCAN_LINE_PER_THREAD = 64


def scan_source(op: str, in_type: str, acc: str, length: int) -> str:
    """``scan.wgsl`` for ``op`` (``sum``, ``prod``, ``logsumexp``, ``max``, ``min``: the last two with
    positions) over inputs of WGSL type ``in_type`` accumulated in ``acc`` (``f32`` or ``i32``)."""
    rule, init = SCANS[op][acc]
    arg = op in ("max", "min")
    positions = (
        "@group(0) @binding(2) var<storage, read_write> positions: array<i32>;"
        if arg
        else "var<private> positions: array<i32, 1>;"  # never written: ARG is false
    )
    return shaders.source(
        "scan",
        ACC=acc,
        IN_TYPE=in_type,
        POSITIONS=positions,
        X_BINDING="3" if arg else "2",
        LINE_PER_THREAD="true" if length <= SCAN_LINE_PER_THREAD else "false",
        ARG="true" if arg else "false",
        LOAD=SCAN_LOADS[(in_type, acc)],
        COMBINE="a" if arg else rule,
        TAKES=rule if arg else "false",
        INIT=init,
    )


# the longest line sort.wgsl sorts: a key and a position per element in 16 KiB of workgroup memory
SORT_MAX = 2048


def sort_source(wgsl_type: str, length: int) -> str:
    """``sort.wgsl`` for lines of ``length`` (at most :data:`SORT_MAX`) elements of ``wgsl_type``."""
    size = 1 << max(length - 1, 0).bit_length()
    return shaders.source(
        "sort", TYPE=wgsl_type, SIZE=str(max(size, 2)), IS_NAN="tb_isnan(v)" if wgsl_type == "f32" else "false"
    )


SOFTMAX_PER_THREAD = 16  # registers per thread for a row held whole: rows up to 256 × 16 elements


def softmax_source(outer_rank: int, log: bool, length: int, subgroups: bool = False) -> str:
    """``softmax.wgsl``; for rows that fit, with the register-resident body written out. ``subgroups``:
    fold rows with subgroup operations (only where the device found them usable)."""
    fills = {"OUTER_RANK": str(outer_rank), "LOG": "true" if log else "false", **shaders.row_tree(subgroups)}
    per_thread = -(-length // 256)
    if per_thread > SOFTMAX_PER_THREAD:
        return shaders.source("softmax", IN_REGISTERS="false", IN_REGISTERS_BODY="", **fills)
    lines = ["        var m = -3.4028235e38;", "        var saw_nan = false;"]
    for r in range(per_thread):
        lines += [
            f"        let j{r} = lid + {256 * r}u;",
            f"        var v{r} = -bitcast<f32>(0x7f800000u);",
            f"        if (j{r} < n) {{",
            f"            v{r} = x[base + j{r} * stride];",
            f"            saw_nan = saw_nan || ((bitcast<u32>(v{r}) & 0x7fffffffu) > 0x7f800000u);",
            f"            m = max(m, v{r});",
            "        }",
        ]
    lines += ["        let row_max = fold_max(lid, select(m, bitcast<f32>(0x7f800000u), saw_nan));"]
    # each exponential is computed once and kept; the outputs take one reciprocal of the sum
    lines += ["        var s = 0.0;"]
    for r in range(per_thread):
        lines += [f"        var e{r} = 0.0;", f"        if (j{r} < n) {{ e{r} = exp(v{r} - row_max); s += e{r}; }}"]
    lines += [
        "        let total = fold_sum(lid, s);",
        "        let log_total = log(total);",
        "        let inverse = 1.0 / total;",
    ]
    for r in range(per_thread):
        lines += [
            f"        if (j{r} < n) {{",
            f"            out[out_base + j{r} * out_stride] = select(e{r} * inverse, v{r} - row_max - log_total, LOG);",
            "        }",
        ]
    return shaders.source("softmax", IN_REGISTERS="true", IN_REGISTERS_BODY="\n".join(lines), **fills)


def elementwise_source(out_type: str, input_types: Sequence[str], rank: int, body: str) -> str:
    inputs = "\n".join(
        f"@group(0) @binding({2 + k}) var<storage, read> in{k}: array<{t}>;" for k, t in enumerate(input_types)
    )
    uses_f64 = "f64" in (out_type, *input_types) or "f64" in body
    text = shaders.source(
        "elementwise",
        OUT_TYPE=out_type,
        INPUTS=inputs,
        RANK=str(rank),
        BODY=body,
        MATH64=shaders.math64() if uses_f64 else "",
    )
    return with_f16(text) if "f16" in (out_type, *input_types) else text


def f64_literal(x: float) -> str:
    """A WGSL expression that is exactly float64(x)."""
    if x != x or x in (float("inf"), float("-inf")):
        bits = struct.unpack("<II", struct.pack("<d", x))
        return f"bitcast<f64>(vec2<u32>({bits[0]}u, {bits[1]}u))"
    return f"{x!r}lf"  # repr is exact and always has a point or an exponent


# what each reduction folds with, starts from and finishes with (``total`` is the folded value,
# ``position`` the winner's index in ARG mode), and the type it writes
REDUCTIONS = {
    "sum": ("a + b", "0.0", "total", "f32"),
    "mean": ("a + b", "0.0", "total / f32(params[1])", "f32"),
    "amax": ("tb_max(a, b)", "-bitcast<f32>(0x7f800000u)", "total", "f32"),
    "amin": ("tb_min(a, b)", "bitcast<f32>(0x7f800000u)", "total", "f32"),
    "prod": ("a * b", "1.0", "total", "f32"),
    "any": ("max(a, b)", "0.0", "select(0u, 1u, total != 0.0)", "u32"),
    "all": ("min(a, b)", "1.0", "select(0u, 1u, total != 0.0)", "u32"),
    "argmax": ("a", "0.0", "i32(position)", "i32"),
    "argmin": ("a", "0.0", "i32(position)", "i32"),
}
# integer and bool inputs fold in i32 (wrapping on overflow, as int32 arithmetic does)
INT_REDUCTIONS = {
    "sum": ("a + b", "0i", "total", "i32"),
    "prod": ("a * b", "1i", "total", "i32"),
    "amax": ("max(a, b)", "i32(-2147483647 - 1)", "total", "i32"),
    "amin": ("min(a, b)", "2147483647i", "total", "i32"),
    "argmax": ("a", "0i", "i32(position)", "i32"),
    "argmin": ("a", "0i", "i32(position)", "i32"),
}
LOADS = {"f32": "v", "u32": "f32(v)", "i32": "f32(v)"}
INT_LOADS = {"u32": "i32(v)", "i32": "v"}
# any/all fold truth values: a load is 1 where it is nonzero (NaN included), else 0
TRUTH = {"f32": "select(0.0, 1.0, v != 0.0)", "u32": "select(0.0, 1.0, v != 0u)", "i32": "select(0.0, 1.0, v != 0i)"}


def reduce_source(kind: str, in_type: str, out_rank: int, red_rank: int) -> str:
    integer = in_type in INT_LOADS and kind in INT_REDUCTIONS
    combine, init, finish, out_type = (INT_REDUCTIONS if integer else REDUCTIONS)[kind]
    if kind in ("any", "all"):
        load = TRUTH[in_type]
    else:
        load = INT_LOADS[in_type] if integer else LOADS[in_type]
    fills = {
        "OUT_RANK": str(out_rank),
        "RED_RANK": str(red_rank),
        "IN_TYPE": in_type,
        "OUT_TYPE": out_type,
        "ACC": "i32" if integer else "f32",
        "IS_NAN": "false" if integer else "tb_isnan(v)",
        "LOAD": load,
        "COMBINE": combine,
        "INIT": init,
        "FINISH": finish,
        "ARG": "true" if kind.startswith("arg") else "false",
        "BETTER": "b < a" if kind == "argmin" else "b > a",
    }
    return shaders.source("reduce", **fills)
