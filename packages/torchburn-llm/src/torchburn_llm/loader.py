"""From a checkpoint folder to a ready model: config, architecture, strict tensor check, weights."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import files, memory
from .architectures import Architecture, architecture_for
from .config import ModelConfig
from .errors import ModelLoadError
from .gguf_file import GGUFCheckpoint
from .linear import STORED
from .model import Transformer
from .weights import LazyTensors, SafetensorsCheckpoint

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
    quant = quant or default_folder_quant(cfg)
    # the weights are read one at a time as the model converts them: it holds its own formats plus
    # one tensor in fp32 (and the embedding, which stays fp32)
    sizes = {n: math.prod(checkpoint.shapes[n]) for n in names}
    embedding = sizes.get("model.embed_tokens.weight", 0)
    memory.check_room(
        int(sum(sizes.values()) * KEPT_BYTES.get(quant, 4) + 4 * (embedding + max(sizes.values(), default=0))),
        f"{folder}: holding its {len(names)} tensors in {quant}",
        "a GGUF file of the model runs in its stored types, or pick a smaller --quant",
    )
    tensors = _lazy_tensors(arch, cfg, checkpoint, names, progress)
    return arch, cfg, Transformer(arch, cfg, tensors, quant)


# bytes per weight each format keeps (int4: 4 bits and a scale and offset per 32)
KEPT_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4 / 576, "int4": 0.5 + 4 / 32}


def _lazy_tensors(
    arch: Architecture,
    cfg: ModelConfig,
    checkpoint: SafetensorsCheckpoint,
    names: list[str],
    progress: Progress | None,
) -> LazyTensors:
    """The checkpoint's tensors as the model reads them, each loaded when first looked up: fused
    matrices (Phi-3's) under the names of their parts, Gemma's norm offsets as scales."""
    fused = arch.fused_parts(cfg)
    origin: dict[str, tuple[str, int, int] | None] = {}  # name -> (stored matrix, rows) or itself
    for name in names:
        prefix, _, part = name.rpartition(".layers.")
        layer, _, rest = part.partition(".")
        parts = fused.get(rest) if prefix else None
        if parts is None:
            origin[name] = None
        else:
            origin.update({f"{prefix}.layers.{layer}.{p}": (name, lo, hi) for p, lo, hi in parts})

    last: dict[str, torch.Tensor] = {}  # the fused matrix read last: its parts are looked up in turn

    def read(name: str) -> torch.Tensor:
        source = origin[name]
        if source is None:
            tensor = checkpoint.load_one(name)
        else:
            stored, lo, hi = source
            if stored not in last:
                last.clear()
                last[stored] = checkpoint.load_one(stored)
            tensor = last[stored][lo:hi].clone()  # its own storage: the fused matrix can go
        if arch.norm_offset and name.endswith("norm.weight"):
            tensor = tensor + 1.0
        return tensor

    return LazyTensors(list(origin), read, progress)


def load_gguf(
    path: str | Path, progress: Progress | None = None, quant: str = STORED
) -> tuple[Architecture, ModelConfig, Transformer, Any]:
    """Load a ``.gguf`` file with the tokenizer and chat templates it carries (the tokenizer, the chat
    template and the one for requests with tools: the file's metadata is parsed once, which is most of a
    small model's load time).

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
    template, tool_template = checkpoint.chat_template(), checkpoint.chat_template("tool_use")
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
    return arch, cfg, model, (tok, template, tool_template)
