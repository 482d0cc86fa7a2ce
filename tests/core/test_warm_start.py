"""The warm-start cache: a compile after the first takes the stored ATen graphs (no tracing), gives eager's
values and gradients on every engine, survives damaged and crafted entries, and keys every input that
decides the lowering."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import torchburn
from helpers import run_python
from torchburn.cache import LOWERED_SUFFIX
from torchburn.cache.dynamo_key import Unkeyable, dynamo_graph_key
from torchburn.cache.store import DiskStore
from torchburn.engines.discovery import get_engine
from torchburn.options import parse_options

ENGINES = ["native", "wgpu"]


def _small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 5),
    )


def _compile_fresh(model: torch.nn.Module, engine: str) -> Callable[..., Any]:
    """A compile that cannot reuse this process's Dynamo cache or programs: only the disk."""
    torch._dynamo.reset()
    torchburn.clear_cache(disk=False)
    return torch.compile(model, backend="torchburn", options={"engine": engine, "fallback": "error"})


def _lowered_entries(cache: Path) -> list[Path]:
    return [e for e in DiskStore(cache).entries() if e.parent.parent.name.endswith(LOWERED_SUFFIX)]


@pytest.mark.parametrize("engine", ENGINES)
def test_inference_compiles_warm_from_the_stored_graph(isolated_state: Path, engine: str) -> None:
    model = _small_cnn().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
        cold = _compile_fresh(model, engine)(x)
        assert torchburn.cache_info()["lowered_writes"] == 1
        warm = _compile_fresh(model, engine)(x)
    info = torchburn.cache_info()
    assert info["lowered_hits"] == 1 and info["lowered_misses"] == 0 and info["disk_lowered_entries"] == 1
    torch.testing.assert_close(cold, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(warm, expected, rtol=1e-4, atol=1e-5)


def _train_step(step: Callable[..., Any], model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Output, every parameter's gradient and the batch-norm statistics after one forward/backward."""
    out = step(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return [out.detach(), *(p.grad for p in model.parameters()), *model.buffers()]  # type: ignore[misc]


@pytest.mark.parametrize("engine", ENGINES)
def test_training_compiles_warm_with_eager_gradients_and_buffer_updates(isolated_state: Path, engine: str) -> None:
    """Batch norm in training mode updates its running statistics (input mutations replayed as copies)."""
    base = _small_cnn().train()
    x = torch.randn(4, 3, 8, 8)
    eager_model, cold_model, warm_model = (copy.deepcopy(base) for _ in range(3))
    expected = _train_step(eager_model, eager_model, x)
    cold = _train_step(_compile_fresh(cold_model, engine), cold_model, x)
    assert torchburn.cache_info()["lowered_writes"] == 1
    warm = _train_step(_compile_fresh(warm_model, engine), warm_model, x)
    assert torchburn.cache_info()["lowered_hits"] == 1
    for got in (cold, warm):
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
    assert int(warm_model[1].num_batches_tracked) == 1  # type: ignore[index]


def test_a_graph_that_switches_grad_on_is_compiled_cold_every_time(isolated_state: Path) -> None:
    """A training step called under ``no_grad`` that enables grad itself: AOTAutograd's runtime
    wrappers give its loss a backward, which a stored graph would not, so none is stored."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def step(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            return model(x).square().mean()

    x = torch.randn(4, 6)
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    for _ in range(2):
        model.zero_grad()
        with torch.no_grad():
            loss = _compile_fresh(step, "native")(x)
        loss.backward()
        for p, e in zip(model.parameters(), expected, strict=True):
            torch.testing.assert_close(p.grad, e)
    assert torchburn.cache_info()["lowered_writes"] == 0 and torchburn.cache_info()["lowered_hits"] == 0


def test_outputs_that_need_no_gradient_and_inputs_that_need_one(isolated_state: Path) -> None:
    """An integer output is not differentiable; the input's own gradient flows through the replay."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.tanh(x @ w)
        return y, y.argmax(dim=1)

    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 3, requires_grad=True)
    results = []
    for _ in range(2):
        x.grad = w.grad = None
        y, idx = _compile_fresh(fn, "native")(x, w)  # type: ignore[arg-type]
        assert not idx.requires_grad and y.requires_grad
        y.pow(2).sum().backward()
        results.append((y.detach(), idx, x.grad, w.grad))
    assert torchburn.cache_info()["lowered_hits"] == 1
    x.grad = w.grad = None
    y, idx = fn(x, w)
    y.pow(2).sum().backward()
    for got in results:
        for g, e in zip(got, (y.detach(), idx, x.grad, w.grad), strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


SCRIPT = """
import json, torch, torchburn
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
x = torch.randn(4, 8)
with torch.no_grad():
    out = torch.compile(model, backend="torchburn", options={"engine": "native", "fallback": "error"})(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
print("INFO" + json.dumps(torchburn.cache_info()))
"""


def test_a_new_process_starts_warm(isolated_state: Path) -> None:
    first, second = (
        json.loads(run_python(SCRIPT, env={"TORCHBURN_CACHE_DIR": str(isolated_state)}).stdout.split("INFO", 1)[1])
        for _ in range(2)
    )
    assert first["lowered_writes"] == 1 and first["lowered_hits"] == 0
    assert second["lowered_hits"] == 1 and second["lowered_writes"] == 0 and second["corrupt_entries"] == 0


def test_a_damaged_entry_is_rebuilt_with_a_warning(isolated_state: Path) -> None:
    model, x = _small_cnn().eval(), torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        _compile_fresh(model, "native")(x)
        (entry,) = _lowered_entries(isolated_state)
        blob = entry.read_bytes()
        entry.write_bytes(blob[:-40] + bytes([blob[-40] ^ 0x01]) + blob[-39:])
        with pytest.warns(torchburn.CacheCorruptionWarning, match="ignoring corrupted entry"):
            got = _compile_fresh(model, "native")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
    info = torchburn.cache_info()
    assert info["lowered_hits"] == 0 and info["lowered_writes"] == 1


def _first_call(entry: dict[str, Any]) -> dict[str, Any]:
    return next(n for n in entry["graphs"]["inference"]["nodes"] if n["op"] == "call_function")  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "craft",
    [
        pytest.param(lambda e: _first_call(e).update(target="aten.from_file.default"), id="from_file"),
        pytest.param(lambda e: _first_call(e).update(target="builtins.eval"), id="not_aten"),
        pytest.param(lambda e: e["graphs"]["inference"]["nodes"][0]["value"].update(shape=[9, 9]), id="input_shape"),
        pytest.param(lambda e: _first_call(e).update(value={"dtype": "Tensor"}), id="dtype"),
        pytest.param(lambda e: e.update(kind="autograd"), id="kind"),
        pytest.param(lambda e: e.update(inputs=99), id="inputs"),
    ],
)
def test_an_authenticated_but_malformed_entry_is_refused(isolated_state: Path, craft: Callable[[Any], None]) -> None:
    """Even an entry signed with the user's own key is checked field by field before it is used."""
    model, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.randn(2, 4)
    with torch.no_grad():
        _compile_fresh(model, "native")(x)
        (path,) = _lowered_entries(isolated_state)
        store, name, digest = DiskStore(isolated_state), path.parent.parent.name, path.stem
        entry = json.loads(store.read(name, digest))  # type: ignore[arg-type]
        craft(entry)
        assert store.write(name, digest, json.dumps(entry).encode())
        with pytest.warns(torchburn.CacheCorruptionWarning, match="stored lowered graphs .* are unusable"):
            got = _compile_fresh(model, "native")(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-6)
    assert torchburn.cache_info()["lowered_writes"] == 1  # rebuilt


def _dynamo_graph(fn: Callable[..., Any], *inputs: Any) -> torch.fx.GraphModule:
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture)(*inputs)
    (gm,) = graphs
    return gm


def _key(fn: Callable[..., Any], *inputs: Any, options: dict[str, Any] | None = None) -> str:
    gm = _dynamo_graph(fn, *inputs)
    return dynamo_graph_key(gm, get_engine("native"), parse_options(options or {})).digest


def test_the_key_follows_everything_that_decides_the_lowering() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a) + b * 2

    x, y = torch.randn(4, 4), torch.randn(4, 4)
    base = _key(f, x, y)
    assert base == _key(f, torch.randn(4, 4), torch.randn(4, 4))  # values do not matter
    changed = {
        "shape": _key(f, torch.randn(4, 5), torch.randn(4, 5)),
        "dtype": _key(f, x.double(), y.double()),
        "strides": _key(f, x.t(), y),
        "requires_grad": _key(f, x.clone().requires_grad_(), y),
        "aliased inputs": _key(f, x, x),
        "options": _key(f, x, y, options={"fallback": "error"}),
        "graph": _key(lambda a, b: torch.relu(a) - b * 2, x, y),
    }
    with torch.no_grad():
        changed["grad mode"] = _key(f, x, y)
    assert len({base, *changed.values()}) == len(changed) + 1, changed


def test_a_graph_calling_an_unnamed_function_has_no_key() -> None:
    local = torch._dynamo.allow_in_graph(lambda t: t * 3)
    gm = _dynamo_graph(lambda t: local(t) + 1, torch.randn(3))
    with pytest.raises(Unkeyable, match=r"does not resolve back to itself|no importable name"):
        dynamo_graph_key(gm, get_engine("native"), parse_options({}))


def test_small_constants_made_in_the_forward_travel_with_the_graph(isolated_state: Path) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.5, -2.0, 0.25]) + torch.tensor([], dtype=x.dtype).sum()

    x = torch.randn(4, 3)
    with torch.no_grad():
        cold, warm = (_compile_fresh(fn, "native")(x) for _ in range(2))  # type: ignore[arg-type]
    assert torchburn.cache_info()["lowered_hits"] == 1
    for got in (cold, warm):
        torch.testing.assert_close(got, fn(x))


def test_a_stored_constant_whose_bytes_do_not_match_its_shape_is_refused(isolated_state: Path) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.5, -2.0, 0.25])

    x = torch.randn(4, 3)
    with torch.no_grad():
        _compile_fresh(fn, "native")(x)  # type: ignore[arg-type]
        (path,) = _lowered_entries(isolated_state)
        store, name, digest = DiskStore(isolated_state), path.parent.parent.name, path.stem
        entry = json.loads(store.read(name, digest))  # type: ignore[arg-type]
        constant = next(n for n in entry["graphs"]["inference"]["nodes"] if n["op"] == "get_attr")
        constant["constant"]["hex"] += "00"
        assert store.write(name, digest, json.dumps(entry).encode())
        with pytest.warns(torchburn.CacheCorruptionWarning, match="bytes do not match its shape"):
            got = _compile_fresh(fn, "native")(x)  # type: ignore[arg-type]
    torch.testing.assert_close(got, fn(x))


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_a_transformers_llama_with_grouped_query_attention_starts_warm(isolated_state: Path, grad: bool) -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 128, (2, 16))
    with torch.set_grad_enabled(grad):
        cold, warm = (_compile_fresh(model, "native")(ids).logits.detach() for _ in range(2))
    assert torchburn.cache_info()["lowered_hits"] == 1
    with torch.no_grad():
        expected = model(ids).logits
    for got in (cold, warm):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_an_engine_failing_while_keying_falls_back_as_its_compile_would(
    isolated_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-start key asks the engine for its key parts (a GPU engine asks its device): a failure
    there is the engine's, reported by the region guard as a fallback, never an escaped error."""
    engine = get_engine("native")

    def lost() -> dict[str, str]:
        raise RuntimeError("device went away")

    monkeypatch.setattr(engine, "cache_key_parts", lost)
    x = torch.randn(4)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.warns(torchburn.TorchBurnFallbackWarning, match="device went away"):
        got = torch.compile(lambda t: t * 2 + 1, backend="torchburn", options={"engine": "native"})(x)
    torch.testing.assert_close(got, x * 2 + 1)
    assert torchburn.cache_info()["lowered_writes"] == 0
