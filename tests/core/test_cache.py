"""The graph cache: key stability and sensitivity, memory and disk hits, corruption, concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

import torchburn
from helpers import program_entries, run_python
from torchburn import graph_codec
from torchburn.cache import graph_key
from torchburn.cache.store import DiskStore
from torchburn.engines.discovery import get_engine
from torchburn.options import parse_options

STRICT_REF = {"engine": "reference", "fallback": "error"}


def _aten_graph(fn, *inputs):  # type: ignore[no-untyped-def]
    return torch.fx.experimental.proxy_tensor.make_fx(fn, tracing_mode="fake")(*inputs)


def _key(fn, *inputs, engine="reference", options=None):  # type: ignore[no-untyped-def]
    gm = _aten_graph(fn, *inputs)
    specs = [torchburn.TensorSpec.of(n.meta["val"]) for n in gm.graph.nodes if n.op == "placeholder"]
    return graph_key(gm, specs, get_engine(engine), parse_options(options or {}))


def test_key_is_stable_and_sensitive_to_what_decides_the_program() -> None:
    x = torch.randn(4, 8)
    base = _key(lambda t: (t + 1).relu(), x)
    assert base.digest == _key(lambda t: (t + 1).relu(), torch.randn(4, 8)).digest  # values do not matter
    changed = {
        "op": _key(lambda t: (t + 1).sigmoid(), x),
        "overload": _key(lambda t: (t + torch.ones_like(t)).relu(), x),
        "constant": _key(lambda t: (t + 2).relu(), x),
        "shape": _key(lambda t: (t + 1).relu(), torch.randn(4, 9)),
        "dtype": _key(lambda t: (t + 1).relu(), x.double()),
        "stride": _key(lambda t: (t + 1).relu(), torch.randn(8, 4).t()),
        "engine": _key(lambda t: (t + 1).relu(), x, engine="tiny"),
        "options": _key(lambda t: (t + 1).relu(), x, options={"cache": "memory"}),
    }
    const_a = _key(lambda t: t * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]), x)
    const_b = _key(lambda t: t * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0]), x)
    assert "_tensor_constant" in dict(const_a.parts)["constants"]
    assert const_a.digest != const_b.digest  # tensor constants enter the key by content
    digests = {base.digest} | {k.digest for k in changed.values()}
    assert len(digests) == len(changed) + 1, "some change did not change the key"
    text = base.describe()
    for part in ("engine: reference", "torch:", "inputs:", "graph:", "options:"):
        assert part in text
    assert len(base.digest) == 64


def test_second_compile_hits_memory() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.compile(model, backend="torchburn", options=STRICT_REF)(x)
        torch._dynamo.reset()
        torch.compile(model, backend="torchburn", options=STRICT_REF)(x)
    info = torchburn.cache_info()
    assert info["compiles"] == 1 and info["memory_hits"] == 1
    assert info["disk_entries"] == 1 and info["disk_writes"] == 1


SCRIPT = """
import json, warnings, torch, torchburn
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
x = torch.randn(4, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad():
        out = torch.compile(model, backend="torchburn", options={"engine": "reference", "fallback": "error"})(x)
        torch.testing.assert_close(out, model(x))
info = torchburn.cache_info()
info["warnings"] = [str(w.message) for w in caught if issubclass(w.category, torchburn.CacheCorruptionWarning)]
print("INFO" + json.dumps(info))
"""


def _run_info(cache: Path) -> dict:  # type: ignore[type-arg]
    out = run_python(SCRIPT, env={"TORCHBURN_CACHE_DIR": str(cache)}).stdout
    return json.loads(out.split("INFO", 1)[1])


def test_disk_hit_in_a_new_process(isolated_state: Path) -> None:
    first = _run_info(isolated_state)
    assert first["compiles"] == 1 and first["disk_writes"] == 1 and first["disk_hits"] == 0
    second = _run_info(isolated_state)
    assert second["disk_hits"] == 1 and second["compiles"] == 0


def _compile_mlp_in_process() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    torchburn.clear_cache(disk=False)  # forget the memory copy: the next compile must read the disk
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="torchburn", options=STRICT_REF)(x), model(x))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupted_entry_is_ignored_with_warning_and_rebuilt(isolated_state: Path, damage: str) -> None:
    _compile_mlp_in_process()
    (entry,) = program_entries(isolated_state)
    blob = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(blob[: len(blob) - 7])
    elif damage == "flip":
        entry.write_bytes(blob[:-3] + bytes([blob[-3] ^ 0x40]) + blob[-2:])
    elif damage == "garbage":
        entry.write_bytes(b"\x80\x04\x95not-a-torchburn-entry")  # pickle-looking bytes must never be loaded
    else:
        entry.write_bytes(b"")
    with pytest.warns(torchburn.CacheCorruptionWarning, match="ignoring corrupted entry"):
        _compile_mlp_in_process()
    info = torchburn.cache_info()
    assert info["corrupt_entries"] == 1 and info["compiles"] == 1 and info["disk_hits"] == 0
    _compile_mlp_in_process()  # the rebuilt entry is whole again
    info = torchburn.cache_info()
    assert info["disk_hits"] == 1 and info["corrupt_entries"] == 0 and info["compiles"] == 0


def test_concurrent_processes_share_the_store(isolated_state: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT],
            env={**os.environ, "TORCHBURN_CACHE_DIR": str(isolated_state)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert json.loads(out.split("INFO", 1)[1])["warnings"] == []
    (entry,) = program_entries(isolated_state)
    assert not list(entry.parent.glob(".*.tmp"))  # no temporaries left behind
    assert _run_info(isolated_state)["disk_hits"] == 1


def test_disk_store_concurrent_writers_never_expose_partial_entries(tmp_path: Path) -> None:
    store = DiskStore(tmp_path)
    digest = "ab" * 32
    payloads = [bytes([i]) * (50_000 + i) for i in range(8)]
    seen_bad: list[str] = []

    def writer(p: bytes) -> None:
        for _ in range(20):
            store.write("reference", digest, p)

    def reader() -> None:
        for _ in range(200):
            got = store.read("reference", digest)
            if got is not None and got not in payloads:
                seen_bad.append("mixed payload")

    with warnings.catch_warnings():
        warnings.simplefilter("error", torchburn.CacheCorruptionWarning)
        threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not seen_bad
    assert store.read("reference", digest) in payloads


def test_stored_graph_cannot_name_arbitrary_code() -> None:
    payload = json.dumps(
        {
            "format": 1,
            "nodes": [
                {"op": "placeholder", "name": "x"},
                {"op": "call_function", "name": "y", "target": "os.system", "args": {"t": [{"n": 0}]}},
                {"op": "output", "name": "out", "args": {"t": [{"t": [{"n": 1}]}]}},
            ],
        }
    ).encode()
    region = _aten_graph(lambda t: t.relu(), torch.randn(3))
    with pytest.raises(graph_codec.GraphCodecError, match="not an ATen op"):
        graph_codec.loads(payload, region)


def test_graph_codec_round_trip_runs_the_same() -> None:
    gm = _aten_graph(
        lambda t: torch.nn.functional.layer_norm(t.permute(1, 0), [4]).clamp(min=-1.0, max=float("inf")),
        torch.randn(4, 6),
    )
    again = graph_codec.loads(graph_codec.dumps(gm), gm)
    x = torch.randn(4, 6)
    torch.testing.assert_close(again(x), gm(x))


def test_clear_cache_deletes_only_torchburn_entries(isolated_state: Path) -> None:
    _run_info(isolated_state)
    isolated_state.mkdir(exist_ok=True)
    foreign = isolated_state / "my-notes.txt"
    foreign.write_text("keep me")
    assert torchburn.cache_info()["disk_entries"] == 1
    torchburn.clear_cache()
    assert torchburn.cache_info()["disk_entries"] == 0
    assert foreign.read_text() == "keep me"


def test_cache_off_and_memory_modes(isolated_state: Path) -> None:
    f = lambda t: t * 3 + 1  # noqa: E731
    torch.compile(f, backend="torchburn", options={**STRICT_REF, "cache": "memory"})(torch.ones(3))
    assert torchburn.cache_info()["disk_entries"] == 0
    torch._dynamo.reset()
    torch.compile(f, backend="torchburn", options={**STRICT_REF, "cache": "off"})(torch.ones(3))
    info = torchburn.cache_info()
    assert info["compiles"] == 2 and info["memory_hits"] == 0 and info["disk_entries"] == 0


def test_unwritable_cache_dir_warns_and_keeps_working(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="cannot write under"):
        out = torch.compile(lambda t: t - 1, backend="torchburn", options=STRICT_REF)(torch.ones(2))
    torch.testing.assert_close(out, torch.zeros(2))


def test_memory_cache_evicts_least_recently_used() -> None:
    from torchburn.cache.store import MemoryCache

    lru = MemoryCache(max_entries=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # "a" is now the most recent
    lru.put("c", 3)
    assert lru.get("b") is None and lru.get("a") == 1 and lru.get("c") == 3
    assert len(lru) == 2
