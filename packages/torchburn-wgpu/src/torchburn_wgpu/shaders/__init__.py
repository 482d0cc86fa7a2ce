"""The one loader of the WGSL kernel files in this folder, one file per kernel family.

A file may hold ``{{NAME}}`` placeholders that a kernel builder fills (a fused elementwise body, a
rank, a combine function); ``{{MATH}}`` pulls in ``math.wgsl``, a builder fills ``{{MATH64}}`` with
``math64()`` where a kernel computes in float64, and ``row_tree()`` gives the fills of a kernel that
folds rows across its workgroup (``{{ROW_TREE}}`` and the entry point's subgroup builtins). Every
placeholder must be filled and no unknown one given, so a typo fails loudly here instead of as a shader
compile error on a GPU.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

HERE = Path(__file__).parent
PLACEHOLDER = re.compile(r"\{\{([A-Z_][A-Z0-9_]*)\}\}")

# one representative instantiation per family: what `tests/wgpu/test_shaders.py` compiles
SAMPLES: dict[str, dict[str, str]] = {
    "elementwise": {
        "OUT_TYPE": "f32",
        "INPUTS": "@group(0) @binding(2) var<storage, read> in0: array<f32>;",
        "RANK": "2",
        "MATH64": "",
        "BODY": "    let v0 = in0[offset_of(0u, t)];\n    out[t] = tb_gelu_erf(v0) + tb_pow(v0, 3.0);",
    },
    "matmul": {
        "TYPE": "f32",
        "ACC": "f32",
        "A_VEC": "true",
        "B_MODE": "2",
        "TILE": "128",
        "ACC_DECLARE": "",
        "ACC_UPDATE": "",
        "ACC_STORE": "",
    },
    "reduce": {
        "OUT_RANK": "1",
        "RED_RANK": "2",
        "IN_TYPE": "f32",
        "OUT_TYPE": "f32",
        "ACC": "f32",
        "IS_NAN": "tb_isnan(v)",
        "LOAD": "v",
        "COMBINE": "a + b",
        "INIT": "0.0",
        "FINISH": "total",
        "ARG": "false",
        "BETTER": "b > a",
    },
    "attention": {"MASK_TYPE": "f32", "MASK_BOOL": "false"},
    "conv": {"ACC_DECLARE": "", "ACC_UPDATE": "", "ACC_STORE": ""},
    "pool": {"MAX": "true"},
    "index": {
        "TYPE": "f32",
        "RANK": "2",
        "MODE": "2",
        "COMBINE": "tb_max(a, b)",
        "OUT_ELEMENT": "atomic<u32>",
        "GATHER_ZERO": "",
        "BODY": "let t = o + moved;\n"
        "    atomicStore(&out[t], bitcast<u32>(combine(bitcast<f32>(atomicLoad(&out[t])), src[s])));",
    },
    "grouped_mm": {"TYPE": "f32"},
    "softmax": {"OUTER_RANK": "1", "LOG": "false", "IN_REGISTERS": "false", "IN_REGISTERS_BODY": ""},
    "norm": {},
    "sort": {"TYPE": "f32", "SIZE": "2048", "IS_NAN": "tb_isnan(v)"},
    "scan": {
        "ACC": "f32",
        "IN_TYPE": "f32",
        "POSITIONS": "@group(0) @binding(2) var<storage, read_write> positions: array<i32>;",
        "X_BINDING": "3",
        "LINE_PER_THREAD": "false",
        "ARG": "true",
        "LOAD": "v",
        "COMBINE": "a",
        "TAKES": "tb_isnan(b) || (!tb_isnan(a) && b >= a)",
        "INIT": "0.0",
    },
}
# families that fold rows across the workgroup: their samples also take ``row_tree()``'s fills
ROW_TREE_FAMILIES = ("softmax", "norm")


# helpers pulled into kernels, not kernels themselves
LIBRARIES = ("math", "math64", "orthogonal", "row_tree", "row_tree_subgroup")
# the libraries a kernel file pulls in by placeholder
INCLUDES = {"MATH": "math"}
# the orthogonal polynomials join ``{{MATH}}`` only in kernels whose fills call one (most never do, and
# every function costs compile time)
ORTHOGONAL_CALL = re.compile(r"\btb_(chebyshev|hermite|laguerre|legendre)_")


def families() -> list[str]:
    """Every kernel family with a file here."""
    return sorted(p.stem for p in HERE.glob("*.wgsl") if p.stem not in LIBRARIES)


@functools.cache
def _text(family: str) -> str:
    path = HERE / f"{family}.wgsl"
    if not path.is_file():
        raise ValueError(f"no WGSL kernel family {family!r} (have: {', '.join(families())})")
    return path.read_text(encoding="utf-8")


def row_tree(subgroups: bool) -> dict[str, str]:
    """Fills for a kernel that calls ``fold_sum``/``fold_max``: the workgroup-memory tree, or (where the
    device has usable subgroups) the subgroup version with the builtins its entry point must take."""
    if not subgroups:
        return {"ROW_TREE": _text("row_tree"), "LANE_ARGS": "", "LANE_INIT": ""}
    return {
        "ROW_TREE": _text("row_tree_subgroup"),
        "LANE_ARGS": ",\n        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32",
        "LANE_INIT": "    sg_lane = lane;\n    sg_size = lanes;",
    }


def math64() -> str:
    """The float64 helpers, for kernels that need them (they compile only where `shader-f64` is on)."""
    return _text("math64")


def source(family: str, **fills: str) -> str:
    """The WGSL of ``family`` with its placeholders filled from ``fills``."""
    text = _text(family)
    wanted = set(PLACEHOLDER.findall(text)) - INCLUDES.keys()
    missing, unknown = wanted - fills.keys(), fills.keys() - wanted
    if missing or unknown:
        raise ValueError(f"{family}.wgsl: missing placeholders {sorted(missing)}, unknown ones {sorted(unknown)}")
    values = {**fills, **{name: _text(library) for name, library in INCLUDES.items()}}
    if any(ORTHOGONAL_CALL.search(fill) for fill in fills.values()):
        values["MATH"] += _text("orthogonal")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)
