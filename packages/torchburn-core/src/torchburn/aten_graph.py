"""From Dynamo's graph to an ATen graph, with the core-ATen decomposition table (``to_aten``). This is
core's step, before any engine: an engine's *lowerings* (``LoweringTable.lower``) then turn ATen nodes
into its own program.

The table is the one ``torch.export`` uses, minus the ops the engine asks to keep whole (so an engine
with a fused attention kernel sees ``_scaled_dot_product_flash_attention_for_cpu`` instead of its
decomposition), plus any decompositions the engine adds.

Two ways down:

- Inference (grad disabled or nothing requires grad), static shapes, no input mutated and no output
  aliasing an input: one functionalized ``make_fx`` trace over Dynamo's own fake values. That is what
  AOTAutograd's inference path produces too, without its metadata pre-pass, input re-fakeification and
  runtime wrappers, which are most of its cost (a ResNet-18 lowers in about 0.12 s instead of 0.35 s).
- Everything else (training, dynamic shapes, input mutations, aliased outputs, anything the direct trace
  does not take): AOTAutograd, which handles all of it.

Some ops are decomposed by Python kernels PyTorch registers at the Autograd or
CompositeImplicitAutograd key (the upsamplings), which run before any decomposition table is asked:
an engine that keeps one of them whole gets it only from the direct trace, which sets those kernels
aside while it runs (:func:`_python_kernels_set_aside`) so that PyTorch's C++ kernels record the op
itself. Under AOTAutograd they stay, because the gradient is then derived from the decomposition.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch._decomp import core_aten_decompositions
from torch._dispatch.python import enable_python_dispatcher
from torch._functorch.aot_autograd import aot_module_simplified
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from .decompositions import for_missing_ops
from .engines.base import Engine

if TYPE_CHECKING:
    from .cache.lowered import Recorder

CompileGraph = Callable[[torch.fx.GraphModule, list[Any], str], Callable[..., Any]]

aten = torch.ops.aten

# op an engine may keep whole -> the overloads whose Python kernels decompose it while tracing
_PYTHON_DECOMPOSED: dict[Any, tuple[Any, ...]] = {
    aten.upsample_bilinear2d.default: (aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec),
    aten.upsample_nearest2d.default: (aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec),
    aten._upsample_nearest_exact2d.default: (
        aten._upsample_nearest_exact2d.default,
        aten._upsample_nearest_exact2d.vec,
    ),
}
_DECOMPOSING_KEYS = (torch._C.DispatchKey.Autograd, torch._C.DispatchKey.CompositeImplicitAutograd)
# the kernels are process-wide: one trace at a time may set them aside
_SET_ASIDE_LOCK = threading.RLock()


@functools.cache
def _core_table() -> dict[Any, Callable[..., Any]]:
    return dict(core_aten_decompositions())


def decomposition_table(engine: Engine) -> dict[Any, Callable[..., Any]]:
    keep = engine.keep_whole()
    table = {op: fn for op, fn in _core_table().items() if op not in keep}
    table.update(for_missing_ops(engine.ops, keep))
    table.update(engine.extra_decompositions())
    return table


def to_aten(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    engine: Engine,
    compile_graph: CompileGraph,
    recorder: Recorder | None = None,
) -> Callable[..., Any]:
    """Trace ``gm`` to ATen and compile; ``compile_graph(aten_gm, inputs, phase)`` compiles each ATen graph (phase
    "inference", or "forward" and "backward" under autograd) into a callable taking its inputs as
    positional arguments. A ``recorder`` is shown each ATen graph before it is compiled (the engine's
    partitioning rewrites it), for the warm-start cache."""
    aten_gm = _direct_inference_graph(gm, decomposition_table(engine), engine.keep_whole())
    if aten_gm is not None:
        if recorder is not None:
            recorder.inference(aten_gm)
        return compile_graph(aten_gm, example_inputs, "inference")  # Dynamo calls it with its hook off
    # a recorder needs the backward graph now, not when the backward first runs (it still compiles then)
    with torch._functorch.config.patch(force_non_lazy_backward_lowering=recorder is not None):
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=functools.partial(_compile_phase, compile_graph, "forward", recorder),
            bw_compiler=functools.partial(_compile_phase, compile_graph, "backward", recorder),
            inference_compiler=functools.partial(_compile_phase, compile_graph, "inference", recorder),
            decompositions=decomposition_table(engine),
        )


def _direct_inference_graph(
    gm: torch.fx.GraphModule, table: dict[Any, Callable[..., Any]], keep_whole: frozenset[Any] = frozenset()
) -> torch.fx.GraphModule | None:
    """The functional ATen graph of ``gm`` by one trace, or None where AOTAutograd must do it."""
    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if not fakes or not all(_static_fake(f) for f in fakes):
        return None  # symbolic sizes, non-tensor inputs or tensor subclasses
    if torch.is_grad_enabled() and any(f.requires_grad for f in fakes):
        return None  # a backward graph is wanted
    if any(f.requires_grad for f in fakes) and any(
        n.op == "call_function" and n.target is torch._C._set_grad_enabled for n in gm.graph.nodes
    ):
        return None  # grad is switched on inside the graph (``with torch.enable_grad()``): the same
    if any(n.op == "get_attr" for n in gm.graph.nodes):
        return None  # constants Dynamo did not lift: AOTAutograd fakeifies them
    fake_mode = fakes[0].fake_mode
    if any(f.fake_mode is not fake_mode for f in fakes):
        return None
    try:
        with functorch_levels_restored(), _python_kernels_set_aside(keep_whole), fake_mode, enable_python_dispatcher():
            # the python dispatcher turns native_batch_norm into its functional eval form, as in AOTAutograd
            traced = make_fx(torch.func.functionalize(gm, remove="mutations"), decomposition_table=table)(*fakes)
    except Exception:  # whatever this trace cannot take, AOTAutograd gets to try
        return None
    traced.graph.eliminate_dead_code()
    if not _functional_and_unaliased(traced.graph):
        return None
    traced.recompile()
    return traced


@contextlib.contextmanager
def functorch_levels_restored() -> Iterator[None]:
    """Where the block raises, functorch's stack of transforms is put back as it was. A graph that uses
    ``torch.vmap`` (Mamba's scan) enters a vmap level as one of its ops and leaves it as a later one; a
    trace that fails between the two leaves the level entered, and then every later trace fails
    ("batched == nullptr") and Dynamo's guard on the transform state fails on the frame."""
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    try:
        yield
    except BaseException:
        torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)
        raise


@contextlib.contextmanager
def _python_kernels_set_aside(keep_whole: frozenset[Any]) -> Iterator[None]:
    """Within the block, the ops of :data:`_PYTHON_DECOMPOSED` in ``keep_whole`` dispatch to PyTorch's
    C++ kernels instead of the Python ones that would decompose them."""
    overloads = [o for op, group in _PYTHON_DECOMPOSED.items() if op in keep_whole for o in group]
    if not overloads:
        yield
        return
    with _SET_ASIDE_LOCK:
        saved = {o: {k: o.py_kernels.pop(k) for k in _DECOMPOSING_KEYS if k in o.py_kernels} for o in overloads}
        for o in overloads:
            o._dispatch_cache.clear()
        try:
            yield
        finally:
            for o, kernels in saved.items():
                o.py_kernels.update(kernels)
                o._dispatch_cache.clear()


def _static_fake(value: object) -> bool:
    return (
        type(value) is FakeTensor
        and all(isinstance(s, int) for s in value.shape)
        and all(isinstance(s, int) for s in value.stride())
    )


def _functional_and_unaliased(graph: torch.fx.Graph) -> bool:
    """No op writes to anything (functionalization writes input mutations back with ``copy_``), and no
    output is an input, a view of one, or a view sharing its base with another output: those need
    AOTAutograd's runtime wrapper to keep PyTorch's aliasing, since a compiled program returns fresh
    tensors."""
    for node in graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            return False
    roots = [_alias_root(out) for out in graph.output_node().all_input_nodes]
    return all(r.op != "placeholder" for r in roots) and len(set(roots)) == len(roots)


def _alias_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose storage ``node`` views (itself when it is not a view)."""
    while isinstance(node.target, torch._ops.OpOverload) and node.target._schema.returns[0].alias_info is not None:
        base = node.args[0]
        if not isinstance(base, torch.fx.Node):
            break
        node = base
    return node


# AOTAutograd compiles the backward graph when the backward first runs. A function compiled whole,
# training step included (`loss.backward()` inside it), runs that backward under Dynamo's frame hook,
# which would then trace TorchBurn's own compiler and runtime as user code: both stay outside it.
@torch._dynamo.disable  # type: ignore[untyped-decorator]
def _compile_phase(
    compile_graph: CompileGraph,
    phase: str,
    recorder: Recorder | None,
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
) -> Callable[..., Any]:
    if recorder is not None:
        _record(recorder, phase, gm)
    if phase == "backward" and recorder is not None:
        # asked for early only to be recorded: compile when the backward first runs, as AOTAutograd would
        compiled_later: list[Callable[..., Any]] = []

        def compiled(*args: Any) -> Any:
            if not compiled_later:
                compiled_later.append(compile_graph(gm, example_inputs, phase))
            return compiled_later[0](*args)
    else:
        compiled = compile_graph(gm, example_inputs, phase)

    @torch._dynamo.disable  # type: ignore[untyped-decorator]
    def run(args: list[Any]) -> Any:
        return compiled(*args)

    run._boxed_call = True  # AOTAutograd passes the argument list as is
    result: Callable[..., Any] = run
    return result


def _record(recorder: Recorder, phase: str, gm: torch.fx.GraphModule) -> None:
    """Show the recorder an AOTAutograd graph with the metadata that says how its results split."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if phase == "backward":
        recorder.backward(gm)
    elif meta is None:
        recorder.failure = "AOTAutograd's metadata is not available"
    elif phase == "forward":
        recorder.forward(gm, meta)
    else:
        recorder.inference(gm, meta)
