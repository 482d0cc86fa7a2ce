"""The disk cache is untrusted: crafted, foreign and symlinked entries can neither run, read nor write
anything, and are rebuilt. Every attack file here is made by the test itself."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch

import torchburn
from helpers import program_entries, run_python
from torchburn import graph_codec
from torchburn.cache.secret import forget, key_path
from torchburn.cache.store import LAYOUT, DiskStore

STRICT_REF = {"engine": "reference", "fallback": "error"}


def relu_plus_one(t: torch.Tensor) -> torch.Tensor:
    return (t + 1).relu()


def _compile_fresh(fn, x):  # type: ignore[no-untyped-def]
    """Compile ``fn`` as a new process would: nothing in memory, so the disk store is read."""
    torch._dynamo.reset()
    torchburn.clear_cache(disk=False)
    with torch.no_grad():
        return torch.compile(fn, backend="torchburn", options=STRICT_REF)(x)


def _only_entry(cache: Path) -> Path:
    (entry,) = program_entries(cache)
    return entry


def _entry_graph(entry: Path) -> dict:  # type: ignore[type-arg]
    """The stored graph of an entry written by this user (its payload is the graph's JSON)."""
    digest = entry.stem
    payload = DiskStore(entry.parents[3]).read("reference", digest)
    assert payload is not None
    return json.loads(payload)  # type: ignore[no-any-return]


def _plant(cache: Path, entry: Path, graph: dict) -> None:  # type: ignore[type-arg]
    """Replace the entry by ``graph`` with a valid MAC: what an attacker holding the user's key could
    write, so that only the graph checks stand between the entry and the process."""
    DiskStore(cache).write("reference", entry.stem, json.dumps(graph).encode())


def test_crafted_entry_cannot_read_or_write_files(isolated_state: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious data, not to be overwritten")
    x = torch.randn(8)
    _compile_fresh(relu_plus_one, x)
    entry = _only_entry(isolated_state)
    n = secret.stat().st_size
    crafted = {
        "format": 1,
        "nodes": [
            {"op": "placeholder", "name": "x"},
            {
                "op": "call_function",
                "name": "leak",
                "target": "aten.from_file.default",
                "args": {"t": [str(secret), False, n]},
                "kwargs": {"dtype": {"dtype": "uint8"}},
            },
            {
                "op": "call_function",
                "name": "dst",
                "target": "aten.from_file.default",
                "args": {"t": [str(victim), True, n]},
                "kwargs": {"dtype": {"dtype": "uint8"}},
            },
            {"op": "call_function", "name": "w", "target": "aten.copy_.default", "args": {"t": [{"n": 2}, {"n": 1}]}},
            {
                "op": "call_function",
                "name": "f",
                "target": "aten._to_copy.default",
                "args": {"t": [{"n": 1}]},
                "kwargs": {"dtype": {"dtype": "float32"}},
            },
            {"op": "output", "name": "output", "args": {"t": [{"t": [{"n": 4}]}]}},
        ],
    }
    _plant(isolated_state, entry, crafted)
    with pytest.warns(torchburn.CacheCorruptionWarning, match=r"aten\.from_file\.default is not in the region"):
        out = _compile_fresh(relu_plus_one, x)
    torch.testing.assert_close(out, relu_plus_one(x))
    assert victim.read_bytes() == b"precious data, not to be overwritten"
    assert torchburn.cache_info()["compiles"] == 1  # rebuilt, and stored again
    assert _entry_graph(entry)["nodes"][1]["target"] == "aten.add.Tensor"


def test_crafted_entry_cannot_swap_an_op(isolated_state: Path) -> None:
    def both(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return t.relu(), t.neg()

    x = torch.randn(8)
    _compile_fresh(both, x)
    entry = _only_entry(isolated_state)
    graph = _entry_graph(entry)
    targets = [node.get("target") for node in graph["nodes"]]
    # within the region's own ops: swap relu and neg
    i, j = targets.index("aten.relu.default"), targets.index("aten.neg.default")
    graph["nodes"][i]["target"], graph["nodes"][j]["target"] = targets[j], targets[i]
    _plant(isolated_state, entry, graph)
    with pytest.warns(torchburn.CacheCorruptionWarning, match="stored graph is not the region's"):
        relu, neg = _compile_fresh(both, x)
    torch.testing.assert_close(relu, x.relu())
    torch.testing.assert_close(neg, -x)

    # an op from outside the region is refused before any graph is built
    graph["nodes"][i]["target"] = "aten.sigmoid.default"
    _plant(isolated_state, entry, graph)
    with pytest.warns(torchburn.CacheCorruptionWarning, match=r"aten\.sigmoid\.default is not in the region"):
        relu, _ = _compile_fresh(both, x)
    torch.testing.assert_close(relu, x.relu())


def _shift_references(value):  # type: ignore[no-untyped-def]
    """The graph with every reference to node 1 or later moved one on (after inserting a node at 1)."""
    if isinstance(value, dict):
        if set(value) == {"n"} and value["n"] >= 1:
            return {"n": value["n"] + 1}
        return {k: _shift_references(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift_references(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("extra input", "2 inputs where the region has 1"),
        ("extra output", "2 outputs where the region has 1"),
        ("other argument", "node 1 is aten.add.Tensor where the region has aten.add.Tensor"),
        ("device", "device 'cuda' is not one a stored graph may name"),
        ("dangling node", "not an earlier node"),
    ],
)
def test_decoded_graph_must_match_its_region(change: str, message: str) -> None:
    region = torch.fx.experimental.proxy_tensor.make_fx(relu_plus_one)(torch.randn(4))
    graph = json.loads(graph_codec.dumps(region))
    nodes = graph["nodes"]
    if change == "extra input":
        nodes.insert(1, {"op": "placeholder", "name": "y"})
        graph = _shift_references(graph)
    elif change == "extra output":
        nodes[-1]["args"] = {"t": [{"t": [{"n": 2}, {"n": 1}]}]}
    elif change == "other argument":
        nodes[1]["args"] = {"t": [{"n": 0}, 2]}
    elif change == "device":
        nodes[1]["kwargs"] = {"device": {"device": "cuda"}}
    else:
        nodes[1]["args"] = {"t": [{"n": 7}, 1]}
    with pytest.raises(graph_codec.GraphCodecError, match=message):
        graph_codec.loads(json.dumps(graph).encode(), region)


def test_entry_written_with_another_key_is_rebuilt(isolated_state: Path) -> None:
    x = torch.randn(8)
    _compile_fresh(relu_plus_one, x)
    entry = _only_entry(isolated_state)
    payload = DiskStore(isolated_state).read("reference", entry.stem)
    assert payload is not None
    # the same, well-formed entry, authenticated with someone else's key
    DiskStore(isolated_state, key=lambda: b"k" * 32).write("reference", entry.stem, payload)
    with pytest.warns(torchburn.CacheCorruptionWarning, match="not written with this user's cache key"):
        out = _compile_fresh(relu_plus_one, x)
    torch.testing.assert_close(out, relu_plus_one(x))
    info = torchburn.cache_info()
    assert info["corrupt_entries"] == 1 and info["compiles"] == 1 and info["disk_writes"] == 1
    _compile_fresh(relu_plus_one, x)
    assert torchburn.cache_info()["disk_hits"] == 1  # rewritten with this user's key


COPY_SCRIPT = """
import torch, torchburn
f = lambda t: (t + 1).relu()
with torch.no_grad():
    torch.compile(f, backend="torchburn", options={"engine": "reference", "fallback": "error"})(torch.randn(8))
assert torchburn.cache_info()["disk_writes"] == 1
"""


def test_copied_cache_dir_carries_no_key(isolated_state: Path, tmp_path: Path) -> None:
    """Entries made by another user (another data dir, so another key) in a shared cache dir are not
    trusted here."""
    other_home = tmp_path / "other-user-data"
    run_python(COPY_SCRIPT, env={"TORCHBURN_CACHE_DIR": str(isolated_state), "XDG_DATA_HOME": str(other_home)})
    with pytest.warns(torchburn.CacheCorruptionWarning, match="not written with this user's cache key"):
        out = _compile_fresh(relu_plus_one, torch.ones(8))
    torch.testing.assert_close(out, torch.full((8,), 2.0))
    assert torchburn.cache_info()["disk_hits"] == 0
    theirs = other_home / "torchburn" / "cache.key"
    assert theirs.is_file() and theirs.read_bytes() != key_path().read_bytes()


def test_key_is_private_and_outside_the_cache(isolated_state: Path) -> None:
    _compile_fresh(relu_plus_one, torch.randn(8))
    key_file = key_path()
    assert key_file.is_file() and not key_file.resolve().is_relative_to(isolated_state.resolve())
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    key = key_file.read_bytes()
    assert len(key) == 32
    for path in isolated_state.rglob("*"):
        if path.is_file():
            assert key not in path.read_bytes() and key.hex().encode() not in path.read_bytes()


def test_key_readable_by_others_disables_the_disk_cache(isolated_state: Path) -> None:
    _compile_fresh(relu_plus_one, torch.randn(8))
    key_path().chmod(0o644)
    forget()
    torchburn.clear_cache()
    with pytest.warns(UserWarning, match="readable or writable by others"):
        out = _compile_fresh(relu_plus_one, torch.ones(8))
    torch.testing.assert_close(out, torch.full((8,), 2.0))
    assert torchburn.cache_info()["disk_entries"] == 0


def test_key_inside_the_cache_dir_keeps_programs_in_memory(
    isolated_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(isolated_state / "data"))
    from torchburn import cache

    monkeypatch.setattr(cache, "_warned_key_inside", False)
    with pytest.warns(UserWarning, match="contains the cache key"):
        out = _compile_fresh(relu_plus_one, torch.ones(8))
    torch.testing.assert_close(out, torch.full((8,), 2.0))
    assert torchburn.cache_info()["disk_entries"] == 0


# --- symlinks and other things that are not entries ------------------------------------------------


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    return outside


def test_clear_never_leaves_the_cache_dir(isolated_state: Path, tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    name = "ab" * 32 + ".tbp"
    bait = [outside / name, outside / ".0123456789abcdef.x1.tmp", outside / "notes.txt"]
    for path in bait:
        path.write_text("keep me")
    _compile_fresh(relu_plus_one, torch.randn(8))  # one real entry
    base = isolated_state / LAYOUT
    (base / "reference" / "ab").symlink_to(outside, target_is_directory=True)  # a shard that leads out
    (base / "evil").symlink_to(outside, target_is_directory=True)  # an engine folder that leads out
    real_shard = _only_entry(isolated_state).parent
    (real_shard / ("cd" * 32 + ".tbp")).symlink_to(outside / name)  # an entry that leads out
    (isolated_state / "v1").symlink_to(outside, target_is_directory=True)  # an old layout that leads out
    torchburn.clear_cache()
    for path in bait:
        assert path.read_text() == "keep me"
    assert DiskStore(isolated_state).entries() == []
    assert (real_shard / ("cd" * 32 + ".tbp")).is_symlink()  # skipped, not followed


def test_symlinked_entry_is_not_read(isolated_state: Path, tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    x = torch.randn(8)
    _compile_fresh(relu_plus_one, x)
    entry = _only_entry(isolated_state)
    target = outside / "entry.tbp"
    target.write_bytes(entry.read_bytes())  # a valid entry, but reached through a symlink
    entry.unlink()
    entry.symlink_to(target)
    with pytest.warns(torchburn.CacheCorruptionWarning, match="symlink"):
        out = _compile_fresh(relu_plus_one, x)
    torch.testing.assert_close(out, relu_plus_one(x))
    info = torchburn.cache_info()
    assert info["disk_hits"] == 0 and info["compiles"] == 1
    assert not entry.is_symlink()  # the rebuilt entry replaced the link ...
    assert target.read_bytes() != b""  # ... and left its target alone


def test_symlinked_folder_is_neither_read_nor_written(isolated_state: Path, tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    x = torch.randn(8)
    _compile_fresh(relu_plus_one, x)
    shard = _only_entry(isolated_state).parent
    moved = outside / "shard"
    shard.rename(moved)
    shard.symlink_to(moved, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in moved.iterdir()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _compile_fresh(relu_plus_one, x)
    torch.testing.assert_close(out, relu_plus_one(x))
    assert torchburn.cache_info()["disk_hits"] == 0
    assert any("cannot write under" in str(w.message) for w in caught)
    assert {p.name: p.read_bytes() for p in moved.iterdir()} == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX feature")
def test_fifo_in_place_of_an_entry_does_not_hang(isolated_state: Path) -> None:
    x = torch.randn(8)
    _compile_fresh(relu_plus_one, x)
    entry = _only_entry(isolated_state)
    entry.unlink()
    os.mkfifo(entry)
    with pytest.warns(torchburn.CacheCorruptionWarning, match="not a regular file"):
        out = _compile_fresh(relu_plus_one, x)
    torch.testing.assert_close(out, relu_plus_one(x))


def test_store_refuses_names_that_are_paths(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with pytest.warns(UserWarning, match="cannot name a cache folder"):
        assert not DiskStore(root).write("../../escape", "ab" * 32, b"x")
    with pytest.warns(UserWarning, match="not a 64-digit hex"):
        assert not DiskStore(root).write("reference", "../" * 8, b"x")
    assert DiskStore(root).read("../../escape", "ab" * 32) is None
    assert not root.exists() or not any(p.is_file() for p in root.rglob("*"))
    assert not (tmp_path.parent / "escape").exists()
