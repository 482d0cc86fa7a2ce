"""Hub ids with a quant tag (``org/name:Q8_0``) resolve to one .gguf file of a GGUF repo, downloaded from a
Hub on localhost and then found in the cache offline; a GGUF-only repo without a tag gets the default pick,
a safetensors repo its checkpoint folder as before. Each case runs in a fresh interpreter, since
huggingface_hub reads its environment once."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_hub import FakeHub, Repo, hub_env, random_bytes, serve
from helpers import run_python

GGUF_FILES = {
    "tiny-Q4_K_M.gguf": random_bytes(3000, 1),
    "tiny-Q8_0.gguf": random_bytes(5000, 2),
    "Q2_K/tiny-Q2_K-00001-of-00002.gguf": random_bytes(700, 3),
    "Q2_K/tiny-Q2_K-00002-of-00002.gguf": random_bytes(800, 4),
    "README.md": b"# tiny\n",
}
CHECKPOINT_FILES = {
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}).encode(),
    "model.safetensors": random_bytes(4000, 5),
    "tokenizer.json": b"{}",
    "pytorch_model.bin": random_bytes(4000, 6),
    "modeling_tiny.py": b"raise SystemExit('never run')\n",
}


@pytest.fixture()
def hub() -> Iterator[FakeHub]:
    repos = {"acme/tiny-GGUF": Repo(dict(GGUF_FILES)), "acme/tiny": Repo(dict(CHECKPOINT_FILES))}
    with serve(FakeHub(repos)) as running:
        yield running


def _resolve(env: dict[str, str], *refs: str) -> list[str]:
    """What ``hub.resolve`` gives for each ref, or the error it raises, one line each."""
    code = f"""
from torchburn_llm import ModelLoadError, hub
for ref in {list(refs)!r}:
    try:
        print(hub.resolve(ref))
    except ModelLoadError as exc:
        print("error:", exc)
"""
    return run_python(code, env).stdout.splitlines()


def test_a_pulled_quant_resolves_offline_to_the_same_file(hub: FakeHub, tmp_path: Path) -> None:
    env = hub_env(hub, tmp_path / "hf")
    pulled = run_python("from torchburn_llm import hub; print(hub.pull('acme/tiny-GGUF:q8_0').path)", env)
    path = Path(pulled.stdout.strip())
    assert path.read_bytes() == GGUF_FILES["tiny-Q8_0.gguf"]
    assert path.is_relative_to(tmp_path / "hf" / "hub")  # HF_HOME's cache
    assert hub.downloads("acme/tiny-GGUF") == ["tiny-Q8_0.gguf"]
    offline = hub_env(hub, tmp_path / "hf", HF_HUB_OFFLINE="1")
    hub.requests.clear()
    lines = _resolve(offline, "acme/tiny-GGUF:Q8_0", "acme/tiny-GGUF", "acme/tiny-GGUF:Q4_K_M", "acme/other:Q8_0")
    assert lines[0] == str(path)
    assert lines[1] == str(path)  # no tag: the only quant cached
    assert lines[2] == "error: acme/tiny-GGUF has no GGUF quant 'Q4_K_M' in the Hugging Face cache; available: Q8_0"
    assert lines[3].startswith("error: acme/other:Q8_0 is not in the Hugging Face cache and the Hub cannot be reached")
    assert hub.requests == []  # offline means offline
    # a Hub that does not answer: the cache serves, as huggingface_hub's own downloads fall back to it
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        unreachable = hub_env(hub, tmp_path / "hf", HF_ENDPOINT=f"http://127.0.0.1:{closed.getsockname()[1]}")
        assert _resolve(unreachable, "acme/tiny-GGUF:q8_0") == [str(path)]


def test_a_gguf_repo_without_tag_fetches_the_default_pick_only(hub: FakeHub, tmp_path: Path) -> None:
    [line] = _resolve(hub_env(hub, tmp_path / "hf"), "acme/tiny-GGUF")
    assert line.endswith("/tiny-Q4_K_M.gguf")
    assert Path(line).read_bytes() == GGUF_FILES["tiny-Q4_K_M.gguf"]
    assert hub.downloads("acme/tiny-GGUF") == ["tiny-Q4_K_M.gguf"]


def test_a_safetensors_repo_without_tag_is_its_checkpoint_folder(hub: FakeHub, tmp_path: Path) -> None:
    folder, error = _resolve(hub_env(hub, tmp_path / "hf"), "acme/tiny", "acme/tiny:Q4_K_M")
    assert sorted(p.name for p in Path(folder).iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (Path(folder) / "model.safetensors").read_bytes() == CHECKPOINT_FILES["model.safetensors"]
    assert sorted(hub.downloads("acme/tiny")) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert error == (
        "error: acme/tiny has no .gguf files, only safetensors: load it as acme/tiny (and convert with --quant int8 "
        "or int4 if you like); :Q4_K_M picks a file of a GGUF repo"
    )


def test_a_split_quant_is_fetched_whole_and_refused_at_load(hub: FakeHub, tmp_path: Path) -> None:
    code = """
import torchburn
from torchburn_llm import ModelLoadError
try:
    torchburn.LLM.from_pretrained("acme/tiny-GGUF:Q2_K")
except ModelLoadError as exc:
    print(exc)
"""
    out = run_python(code, hub_env(hub, tmp_path / "hf")).stdout
    assert "tiny-Q2_K-00001-of-00002.gguf is part 1 of a GGUF model split into 2 files" in out
    assert "llama-gguf-split --merge" in out
    assert sorted(hub.downloads("acme/tiny-GGUF")) == [
        "Q2_K/tiny-Q2_K-00001-of-00002.gguf",
        "Q2_K/tiny-Q2_K-00002-of-00002.gguf",
    ]
