"""The backend end to end: discovery by Dynamo, fallback modes, coverage, keep-whole lowering."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import torchburn_tiny_engine as tiny

import torchburn
from helpers import engine_counts, run_python


def test_backend_found_without_importing_torchburn() -> None:
    proc = run_python(
        """
        import sys, torch
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        x = torch.randn(8, 16)
        fast = torch.compile(model, backend="torchburn", options={"engine": "reference", "fallback": "error"})
        with torch.no_grad():
            torch.testing.assert_close(fast(x), model(x))
        import torchburn
        ran = sum(r["engine"] for r in torchburn.coverage()["reference"].values())
        print("ran", ran)
        """
    )
    assert int(proc.stdout.split("ran")[1]) >= 3  # addmm, relu, addmm at least


def test_backend_after_import_runs_in_engine_strictly() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    fast = torch.compile(model, backend="torchburn", options={"engine": "reference", "fallback": "error"})
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    ran, fell = engine_counts("reference")
    assert ran >= 3 and fell == 0


def _mixed(x: torch.Tensor) -> torch.Tensor:
    # add/relu/mul are tiny's; exp and sum are not
    return (torch.relu(x + 1.0) * x).exp().sum(-1) * x[:, 0]


def test_fallback_error_names_the_unsupported_ops() -> None:
    fast = torch.compile(_mixed, backend="torchburn", options={"engine": "tiny", "fallback": "error"})
    with pytest.raises(torchburn.FallbackError) as info:
        fast(torch.randn(4, 5))
    err = info.value
    assert err.engine == "tiny"
    assert "aten.exp.default" in err.ops and "aten.sum.dim_IntList" in err.ops
    assert "aten.add.Tensor" not in err.ops
    assert "aten.exp.default: op not implemented" in str(err)


def test_fallback_warn_runs_eagerly_warns_once_and_counts() -> None:
    x = torch.randn(4, 5)
    tiny.KERNEL_CALLS.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = torch.compile(_mixed, backend="torchburn", options={"engine": "tiny"})
        torch.testing.assert_close(fast(x), _mixed(x))
        torch.compile(lambda t: t.exp() + 1, backend="torchburn", options={"engine": "tiny"})(x)
    fallback_warnings = [w for w in caught if issubclass(w.category, torchburn.TorchBurnFallbackWarning)]
    exp_warnings = [w for w in fallback_warnings if "aten.exp.default" in str(w.message)]
    assert len(exp_warnings) == 1, [str(w.message) for w in fallback_warnings]
    report = torchburn.coverage()["tiny"]
    assert report["aten.exp.default"] == {"engine": 0, "fallback": 2}
    assert report["aten.relu.default"]["engine"] == 1
    assert tiny.KERNEL_CALLS["aten.relu.default"] == 1  # tiny's own kernel produced the value


def test_fallback_silent_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", torchburn.TorchBurnFallbackWarning)
        fast = torch.compile(_mixed, backend="torchburn", options={"engine": "tiny", "fallback": "silent"})
        x = torch.randn(3, 5)
        torch.testing.assert_close(fast(x), _mixed(x))
    assert torchburn.coverage()["tiny"]["aten.exp.default"]["fallback"] == 1


def test_engine_keeps_requested_ops_whole() -> None:
    """tiny asks to keep gelu whole: it must see aten.gelu, not its erf decomposition."""
    tiny.KERNEL_CALLS.clear()
    fast = torch.compile(lambda x: F.gelu(x) * x, backend="torchburn", options={"engine": "tiny", "fallback": "error"})
    x = torch.randn(64)
    torch.testing.assert_close(fast(x), F.gelu(x) * x)
    assert tiny.KERNEL_CALLS == {"aten.gelu.default": 1, "aten.mul.Tensor": 1}


def test_reference_sees_decomposed_ops() -> None:
    """The reference engine keeps nothing whole: silu arrives decomposed by the core-ATen table."""
    fast = torch.compile(F.silu, backend="torchburn", options={"engine": "reference", "fallback": "error"})
    x = torch.randn(32)
    torch.testing.assert_close(fast(x), F.silu(x))
    ops = set(torchburn.coverage()["reference"])
    assert "aten.silu.default" not in ops and "aten.sigmoid.default" in ops


def test_non_contiguous_input_is_refused_by_contiguous_only_engine() -> None:
    x = torch.randn(6, 4).t()  # strided view
    fast = torch.compile(lambda t: t + t, backend="torchburn", options={"engine": "tiny", "fallback": "silent"})
    torch.testing.assert_close(fast(x), x + x)
    assert torchburn.coverage()["tiny"]["aten.add.Tensor"] == {"engine": 0, "fallback": 1}


def _aten(fn: object, *args: torch.Tensor) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fn", "direct"),
    [
        (lambda x, y: ((x * y).relu(),), True),  # one region, one output
        (lambda x, y: ((x + y).relu(), x * y), True),  # one region, two outputs
        (lambda x, y: ((x + y), x), False),  # an input returned as is
        (lambda x, y: ((x * 2).exp(), y + 1), False),  # exp falls back: several pieces
        (lambda x, y: ((x + y).relu(),) * 2, False),  # one value returned twice
    ],
    ids=["one_output", "two_outputs", "passthrough", "fallback", "same_output_twice"],
)
def test_whole_graph_region_skips_the_graph_forward_only_when_it_is_the_whole_graph(fn: object, direct: bool) -> None:
    from torchburn.engines.discovery import resolve_engine
    from torchburn.options import parse_options
    from torchburn.partition import partition_and_compile, whole_graph_program

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    fused = partition_and_compile(
        _aten(fn, x, y), resolve_engine("tiny"), parse_options({"engine": "tiny", "fallback": "silent"})
    )
    program = whole_graph_program(fused)
    assert (program is not None) is direct
    want = fn(x, y)  # type: ignore[operator]
    got = program(x, y) if program is not None else fused(x, y)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    # and through torch.compile, which takes the direct path when there is one
    fast = torch.compile(fn, backend="torchburn", options={"engine": "tiny", "fallback": "silent"})
    for g, w in zip(fast(x, y), want, strict=True):
        torch.testing.assert_close(g, w)


def test_fully_supported_graph_is_compiled_whole_without_the_partitioner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the engine takes every node, the graph is one region as it stands: the partitioner's
    search never runs, and the program takes every input in order."""
    import torchburn.partition as partition
    from torchburn.engines.discovery import resolve_engine
    from torchburn.options import parse_options

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the partitioner ran")

    monkeypatch.setattr(partition, "CapabilityBasedPartitioner", refuse)
    x, y = torch.randn(3, 4), torch.randn(3, 4)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * y).relu(), x + y

    fused = partition.partition_and_compile(
        _aten(fn, x, y), resolve_engine("tiny"), parse_options({"engine": "tiny", "fallback": "error"})
    )
    program = partition.whole_graph_program(fused)
    assert program is not None
    for got in (program(x, y), fused(x, y)):
        for g, w in zip(got, fn(x, y), strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
