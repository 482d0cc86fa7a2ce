"""From a checkpoint folder to a ready model: config, architecture, strict tensor check, weights."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import files, memory
from .architectures import Architecture, architecture_for
from .config import ModelConfig
from .errors import ModelLoadError
from .gguf_file import GGUFCheckpoint
from .linear import STORED
from .model import Transformer
from .weights import SafetensorsCheckpoint

# called with (tensors loaded, tensors in all) as loading goes
Progress = Callable[[int, int], None]

# A folder's format when none is asked for: the fastest one within the quality gates against fp32
# (tests/llm/test_accuracy.py: int4 keeps 96.9% of the top-1 tokens and perplexity within 0.3% on the
# shipped model), where every matrix's rows are whole blocks of 32; fp32 otherwise.
FOLDER_DEFAULT = "int4"


def default_folder_quant(cfg: ModelConfig) -> str:
    """:data:`FOLDER_DEFAULT` where every projection's input width is a multiple of 32, else fp32."""
    widths = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim)
    return FOLDER_DEFAULT if all(w % 32 == 0 for w in widths) else "fp32"


def load_folder(
    folder: str | Path, progress: Progress | None = None, quant: str | None = None
) -> tuple[Architecture, ModelConfig, Transformer]:
    """Load a Hugging Face checkpoint folder (``config.json`` + ``*.safetensors``) in ``quant`` (None:
    :func:`default_folder_quant`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is not a folder")
    config_path = folder / "config.json"
    if not files.present(config_path):
        raise ModelLoadError(f"{folder} has no config.json: not a Hugging Face checkpoint folder")
    cfg = ModelConfig.from_dict(files.read_json_object(config_path, folder), source=str(config_path))
    arch = architecture_for(cfg.model_type)
    checkpoint = SafetensorsCheckpoint(folder)
    arch.check(cfg, checkpoint.shapes, str(folder))
    names = [n for n in checkpoint.shapes if n in arch.tensors(cfg) or n == "lm_head.weight"]
    # every tensor is read as fp32 before the weights are converted
    memory.check_room(
        sum(4 * math.prod(checkpoint.shapes[n]) for n in names),
        f"{folder}: reading {len(names)} tensors as fp32",
        "a GGUF file of the model runs in its stored types without an fp32 copy",
    )
    tensors = arch.shift_norms(arch.split_fused(cfg, checkpoint.load(names, progress=progress)))
    return arch, cfg, Transformer(arch, cfg, tensors, quant or default_folder_quant(cfg))


def load_gguf(
    path: str | Path, progress: Progress | None = None, quant: str = STORED
) -> tuple[Architecture, ModelConfig, Transformer, Any]:
    """Load a ``.gguf`` file with the tokenizer and chat template it carries (as a pair: the file's
    metadata is parsed once, which is most of a small model's load time).

    ``stored`` (the default) keeps every matrix in the file's own type, read in place from the mapped
    file: only the norms are read into memory. Another ``quant`` dequantizes to fp32 and converts (under
    int4, Q4_1 projections stay as stored)."""
    from torchburn_native.ggml import TYPES as STORED_TYPES

    from . import tokenizer

    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a file")
    checkpoint = GGUFCheckpoint(path)
    cfg = checkpoint.config
    tok = tokenizer.from_gguf(checkpoint.fields, str(path))
    tokenizer.check_vocabulary(tok, cfg.vocab_size, str(path))
    template = checkpoint.chat_template()
    arch = architecture_for(cfg.model_type)
    arch.check(cfg, checkpoint.shapes, str(path))
    packed: dict[str, Any] = {}
    done: set[str] = set()  # matrices read as stored (a fused one under the names of its parts)
    fused = arch.fused_parts(cfg)

    def layer_part(name: str) -> str:
        return name.split(".", 3)[-1] if name.startswith("model.layers.") else name

    if quant == STORED:
        matrices = [name for name, shape in checkpoint.shapes.items() if len(shape) == 2]
        others = [name for name in matrices if not checkpoint.computable_as_stored(name)]
        if others:
            kinds = sorted({checkpoint.type_name(name) for name in others})
            warnings.warn(
                f"{path}: {len(others)} matrices are of GGUF type(s) {', '.join(kinds)}, which run dequantized to "
                f"fp32 (in their stored type run: {', '.join(STORED_TYPES)})",
                stacklevel=3,
            )
            matrices = [name for name in matrices if name not in others]
        for i, name in enumerate(matrices):
            parts = fused.get(layer_part(name))
            if parts is None:
                packed[name] = checkpoint.stored(name)
            else:  # each projection reads its rows of the fused matrix in place
                prefix = name[: -len(layer_part(name))]
                packed.update({prefix + part: checkpoint.stored(name, (lo, hi)) for part, lo, hi in parts})
            done.add(name)
            if progress is not None:
                progress(i + 1, len(matrices))
    elif quant == "int4":  # Q4_1 projections are our int4 grid already: kept as they are, no f32 round trip
        for name in checkpoint.shapes:
            if name.startswith("model.layers.") and name.endswith("_proj.weight") and layer_part(name) not in fused:
                weights = checkpoint.q4_1_weights(name)
                if weights is not None:
                    packed[name] = weights
    done.update(packed)
    rest = [n for n in checkpoint.shapes if n not in done]
    if quant == STORED:
        remedy = f"use a file whose matrices are of types computed in as stored ({', '.join(STORED_TYPES)})"
    else:
        remedy = "quant='stored' (the default for a GGUF file) keeps its matrices as stored, without an fp32 copy"
    memory.check_room(
        sum(4 * math.prod(checkpoint.shapes[n]) for n in rest),
        f"{path}: dequantizing {len(rest)} tensors to fp32",
        remedy,
    )
    tensors = arch.split_fused(cfg, checkpoint.load(rest, progress=None if quant == STORED else progress))
    model = Transformer(arch, cfg, tensors, quant, packed)
    return arch, cfg, model, (tok, template)
