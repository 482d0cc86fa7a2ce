"""Compiling a Dynamo graph warm (from lowered graphs another process stored) or cold (tracing it).

See :mod:`torchburn.cache.lowered` for what is stored and when; ``torchburn.cache_info()`` counts
``lowered_hits``, ``lowered_misses`` and ``lowered_writes``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import cache
from .aot_replay import Replay
from .aten_graph import CompileGraph, to_aten
from .cache import lowered
from .engines.base import Engine
from .errors import CacheCorruptionWarning
from .graph_codec import GraphCodecError
from .options import CompileOptions


def compile_dynamo_graph(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    engine: Engine,
    options: CompileOptions,
    compile_graph: CompileGraph,
) -> Callable[..., Any]:
    """The compiled callable for Dynamo's graph: from the warm-start cache where an entry exists,
    else by :func:`torchburn.aten_graph.to_aten`, storing what it lowered to for the next process."""
    # a graph that switches grad mode inside runs through AOTAutograd's own runtime wrappers, which
    # the stored form does not replay
    replayable = options.cache == "on" and not switches_grad_mode(gm)
    key = lowered.key_of(gm, engine, options) if replayable else None
    disk = cache._disk_store() if key is not None else None
    if key is None or disk is None:
        return to_aten(gm, example_inputs, engine, compile_graph)
    store = engine.name + cache.LOWERED_SUFFIX
    payload = disk.read(store, key.digest)
    if disk.corrupt_seen:
        cache._bump("corrupt_entries")
    if payload is not None:
        try:
            entry = lowered.decode(payload, example_inputs)
        except GraphCodecError as exc:
            cache._bump("corrupt_entries")
            warnings.warn(
                f"torchburn cache: stored lowered graphs {key.digest[:16]} are unusable ({exc}); they will be rebuilt",
                CacheCorruptionWarning,
                stacklevel=3,
            )
        else:
            cache._bump("lowered_hits")
            return _from_entry(entry, example_inputs, compile_graph)
    cache._bump("lowered_misses")
    recorder = lowered.Recorder(key, len(example_inputs))
    compiled = to_aten(gm, example_inputs, engine, compile_graph, recorder)
    entry_bytes = recorder.payload()
    if entry_bytes is not None and disk.write(store, key.digest, entry_bytes):
        cache._bump("lowered_writes")
    return compiled


def switches_grad_mode(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph turns grad on or off inside (``with torch.enable_grad()`` in the model)."""
    return any(n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes)


def _from_entry(entry: lowered.Lowered, example_inputs: list[Any], compile_graph: CompileGraph) -> Callable[..., Any]:
    if entry.kind == "inference":
        return compile_graph(entry.graphs["inference"], example_inputs, "inference")
    assert entry.layout is not None

    def compile_phase(gm: torch.fx.GraphModule, phase: str) -> Callable[..., Any]:
        return compile_graph(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"], phase)

    return Replay(entry.graphs["forward"], entry.graphs["backward"], entry.layout, compile_phase)
