"""Hub ids resolve through the Hugging Face cache, offline: the snapshot for the revision asked for,
and a clear error for what is not cached. (No test reaches the network.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from helpers import save_tiny_llama  # noqa: E402


@pytest.fixture()
def hub_cache(tmp_path: Path) -> Path:
    """A Hugging Face cache holding ``acme/tiny`` at two revisions: ``main`` and tag ``v1``."""
    repo = tmp_path / "cache" / "models--acme--tiny"
    for ref, commit, seed in (("main", "a" * 40, 0), ("v1", "b" * 40, 1)):
        save_tiny_llama(repo / "snapshots" / commit, seed=seed, layers=1, max_positions=32)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return tmp_path / "cache"


def _run(cache: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_hub_id_loads_each_revision_from_the_cache_offline(hub_cache: Path, tmp_path: Path) -> None:
    code = """
import torch, torchburn
ids = torch.tensor([1, 5, 9, 3])
for rev in (None, "v1"):
    llm = torchburn.LLM.from_pretrained("acme/tiny", revision=rev)
    print(rev, llm.model.forward(ids, llm.model.new_cache(8))[-1, :4].tolist())
"""
    out = _run(hub_cache, code)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    # each revision is its own snapshot: compare with loading those folders directly
    from torchburn_llm import LLM

    ids = torch.tensor([1, 5, 9, 3])
    for rev, commit in (("None", "a" * 40), ("v1", "b" * 40)):
        folder = hub_cache / "models--acme--tiny" / "snapshots" / commit
        direct = LLM.from_pretrained(folder).model
        want = direct.forward(ids, direct.new_cache(8))[-1, :4]
        assert torch.tensor(json.loads(lines[rev])).allclose(want)
    assert lines["None"] != lines["v1"]


def test_uncached_id_or_revision_is_a_clear_error(hub_cache: Path) -> None:
    code = """
import torchburn
from torchburn_llm import ModelLoadError
for repo, rev in (("acme/absent", None), ("acme/tiny", "v9")):
    try:
        torchburn.LLM.from_pretrained(repo, revision=rev)
    except ModelLoadError as exc:
        print(exc)
"""
    out = _run(hub_cache, code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "acme/absent is not in the Hugging Face cache" in lines[0]
    assert "acme/tiny@v9 is not in the Hugging Face cache" in lines[1] or "no revision 'v9'" in lines[1]
    shutil.rmtree(hub_cache)
