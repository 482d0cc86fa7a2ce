"""The planning layer every engine builds on: what turning an ATen region into an engine's own program
needs, written once.

- :class:`LoweringTable` and :class:`Family`: an engine's lowerings, one signature
  (``fn(p, node, *args, **kwargs)``), one family vocabulary;
- :class:`GraphWalk`: the walk over a region graph (inputs, meta propagation, ``getitem``, lazy values
  with several readers);
- :mod:`~torchburn.planning.views`: the view ops and their layouts, computed on meta tensors;
- :mod:`~torchburn.planning.expr`: the fused elementwise expression node (:class:`Expr`), its function
  vocabulary and compute-type rule; each engine supplies a code table for it;
- :class:`PlannedRegion`: a compiled region with one plan per input signature, least recently used out;
- :class:`PlanContext`: the runtime facts (threads, BLAS, device limits) planning may depend on.

An engine is then its code tables (ATen primitive -> its instruction or shader), its kernels and its
runtime. ``tests/plugins/torchburn-tiny-engine`` shows a third-party engine on this layer.
"""

from __future__ import annotations

from .context import PlanContext
from .errors import PlanError
from .expr import ComputeType, Expr, compute_type, promoted_compute_type
from .families import Family
from .region import PlannedRegion, signature
from .table import Lowering, LoweringTable
from .views import (
    ORDER_KEEPING,
    VIEW_OPS,
    Layout,
    StridedSource,
    as_strided_source,
    broadcast_strides,
    contiguous_strides,
    extent,
    layout_of,
    meta_like,
    numel,
    view_layouts,
)
from .walk import GraphWalk

__all__ = [
    "ORDER_KEEPING",
    "VIEW_OPS",
    "Family",
    "GraphWalk",
    "Layout",
    "StridedSource",
    "Lowering",
    "LoweringTable",
    "PlanContext",
    "PlanError",
    "PlannedRegion",
    "ComputeType",
    "Expr",
    "as_strided_source",
    "broadcast_strides",
    "compute_type",
    "contiguous_strides",
    "extent",
    "layout_of",
    "meta_like",
    "numel",
    "promoted_compute_type",
    "signature",
    "view_layouts",
]
