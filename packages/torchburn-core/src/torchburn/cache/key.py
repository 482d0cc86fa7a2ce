"""The graph cache key: a BLAKE3 hash over everything that decides a compiled program.

Like inductor's ``FxGraphHashDetails`` the key keeps its parts, so ``print(key.describe())`` shows
exactly what went in when two runs unexpectedly miss each other.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import blake3
import torch

from .. import graph_codec
from .._version import __version__

if TYPE_CHECKING:
    from ..engines.base import Engine, TensorSpec
    from ..options import CompileOptions

KEY_FORMAT = "torchburn-key-1"


@dataclass(frozen=True)
class GraphKey:
    digest: str  # hex BLAKE3 of all parts
    parts: tuple[tuple[str, str], ...]  # (name, canonical text), in hashing order

    def describe(self, width: int = 120) -> str:
        """One line per part; long parts show their own hash and a prefix."""
        lines = [f"key {self.digest}"]
        for name, text in self.parts:
            if len(text) > width:
                text = f"{text[:width]}... ({len(text)} chars, blake3 {blake3.blake3(text.encode()).hexdigest()[:16]})"
            lines.append(f"  {name}: {text}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.digest


def _tensor_digest(t: torch.Tensor) -> str:
    """BLAKE3 of a tensor's bytes in logical order (read straight from memory: numpy is not required)."""
    data = t.detach().cpu().contiguous()
    size = data.numel() * data.element_size()
    return blake3.blake3(ctypes.string_at(data.data_ptr(), size) if size else b"").hexdigest()


def _constants(gm: torch.fx.GraphModule) -> str:
    """Every get_attr tensor by name, dtype, shape and the hash of its bytes."""
    rows = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                rows.append([node.target, str(value.dtype), list(value.shape), _tensor_digest(value)])
            else:
                rows.append([node.target, type(value).__name__, repr(value)])
    return json.dumps(rows)


def _specs(specs: Iterable[TensorSpec | None]) -> str:
    return json.dumps(
        [
            None
            if s is None
            else [str(s.dtype), [str(d) for d in s.shape], [str(d) for d in s.stride], str(s.storage_offset)]
            for s in specs
        ]
    )


def graph_key(
    gm: torch.fx.GraphModule,
    inputs: Iterable[TensorSpec | None],
    engine: Engine,
    options: CompileOptions,
) -> GraphKey:
    graph_text = json.dumps(graph_codec.encode_graph(gm, strict=False, with_meta=True), sort_keys=True)
    parts: list[tuple[str, Any]] = [
        ("format", KEY_FORMAT),
        ("torchburn", __version__),
        ("torch", torch.__version__),
        ("engine", f"{engine.name} {engine.version}"),
        ("engine_parts", json.dumps(engine.cache_key_parts(), sort_keys=True)),
        ("options", json.dumps(options.key_items())),
        ("inputs", _specs(inputs)),
        ("constants", _constants(gm)),
        ("graph", graph_text),
    ]
    return hash_parts(parts)


def hash_parts(parts: Iterable[tuple[str, Any]]) -> GraphKey:
    """The key over named parts, each kept as text."""
    kept = tuple((name, str(text)) for name, text in parts)
    hasher = blake3.blake3()
    for name, text in kept:
        # length-prefixed so that no two different part lists hash the same bytes
        for field in (name.encode(), text.encode()):
            hasher.update(len(field).to_bytes(8, "little"))
            hasher.update(field)
    return GraphKey(hasher.hexdigest(), kept)
