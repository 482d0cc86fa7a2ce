"""GGUF files for speed comparisons: Llama-shaped models of real sizes with random weights (speed does not
depend on the values), quantized by llama.cpp's own quantizer, and requantizations of a real file.

    python -m torchburn_llm.bench_files random 1b Q4_K_M out/llama-1b-q4_k_m.gguf
    python -m torchburn_llm.bench_files requantize in.gguf Q8_0 out.gguf

Shapes follow Llama 3.2 1B and Llama 3.1 8B (grouped-query attention, 128k-token vocabulary). The
tokenizer is the shipped model's, its vocabulary padded with unused tokens to the shape's size, so
prompts encode as they would with any byte-level BPE. Quantizing needs ``llama-cpp-python`` (the
``llama-cpp`` extra); the unquantized F16 file is written next to the output and removed after.
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .default_model import default_model_path


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    rope_theta: float = 500000.0
    context: int = 8192


SHAPES = {
    "1b": Shape(2048, 8192, 16, 32, 8, 128256, tied=True),
    "3b": Shape(3072, 8192, 28, 24, 8, 128256, tied=True),
    "8b": Shape(4096, 14336, 32, 32, 8, 128256, tied=False),
}

# llama.cpp's file types (llama_ftype) by the names its quantize tool takes
FTYPES = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K_M": 12,
    "Q4_K_M": 15,
    "Q5_K_M": 17,
    "Q6_K": 18,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
}

UNUSED = 5  # GGUF token type of a padding token


def _tokenizer_fields(source: Path) -> dict[str, Any]:
    """The tokenizer metadata of ``source`` as plain values."""
    from gguf import GGUFReader

    reader = GGUFReader(source)
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            out[key] = field.contents()
    return out


def write_random(shape: Shape, path: Path, seed: int = 0) -> None:
    """A Llama of ``shape`` with random F16 weights (F32 norms) at ``path``."""
    from gguf import GGUFWriter, TokenType

    tok = _tokenizer_fields(default_model_path())
    tokens = list(tok["tokenizer.ggml.tokens"])
    types = list(tok.get("tokenizer.ggml.token_type", [int(TokenType.NORMAL)] * len(tokens)))
    pad = shape.vocab - len(tokens)
    tokens += [f"<|unused_{i}|>" for i in range(pad)]
    types += [UNUSED] * pad
    writer = GGUFWriter(path, "llama")
    writer.add_name(f"random llama {shape.hidden}x{shape.layers}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(1)  # mostly F16
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(str(tok.get("tokenizer.ggml.pre", "default")))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(tok["tokenizer.ggml.merges"]))
    writer.add_bos_token_id(int(tok.get("tokenizer.ggml.bos_token_id", 1)))
    writer.add_eos_token_id(int(tok.get("tokenizer.ggml.eos_token_id", 2)))
    rng = np.random.default_rng(seed)
    # one pool of values, read at a different offset per tensor: random enough for a quantizer, and
    # a few seconds for billions of weights rather than minutes
    pool = (rng.standard_normal(1 << 22) * 0.02).astype(np.float16)

    def matrix(rows: int, cols: int) -> np.ndarray:
        start = int(rng.integers(0, pool.size))
        flat = np.resize(np.roll(pool, -start), rows * cols)
        return flat.reshape(rows, cols)

    h, d = shape.hidden, shape.hidden // shape.heads
    writer.add_tensor("token_embd.weight", matrix(shape.vocab, h))
    writer.add_tensor("output_norm.weight", np.ones(h, np.float32))
    if not shape.tied:
        writer.add_tensor("output.weight", matrix(shape.vocab, h))
    for i in range(shape.layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(h, np.float32))
        writer.add_tensor(p + "attn_q.weight", matrix(shape.heads * d, h))
        writer.add_tensor(p + "attn_k.weight", matrix(shape.kv_heads * d, h))
        writer.add_tensor(p + "attn_v.weight", matrix(shape.kv_heads * d, h))
        writer.add_tensor(p + "attn_output.weight", matrix(h, shape.heads * d))
        writer.add_tensor(p + "ffn_gate.weight", matrix(shape.intermediate, h))
        writer.add_tensor(p + "ffn_up.weight", matrix(shape.intermediate, h))
        writer.add_tensor(p + "ffn_down.weight", matrix(h, shape.intermediate))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=True)
    writer.close()


def quantize(source: Path, target: Path, kind: str, threads: int = 0) -> None:
    """``source`` requantized to ``kind`` (a name of :data:`FTYPES`) by llama.cpp's quantizer."""
    if kind not in FTYPES:
        raise ValueError(f"quant {kind!r} is not one of {', '.join(FTYPES)}")
    from .llamacpp_peer import _module

    lib = _module()
    params = lib.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.allow_requantize = True
    params.nthread = threads
    status = lib.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {kind} (status {status})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m torchburn_llm.bench_files", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rand = sub.add_parser("random", help="a random-weight Llama of a real shape, quantized by llama.cpp")
    rand.add_argument("shape", choices=sorted(SHAPES))
    rand.add_argument("quant", choices=[*sorted(FTYPES), "F16"])
    rand.add_argument("out", type=Path)
    req = sub.add_parser("requantize", help="a GGUF file requantized by llama.cpp")
    req.add_argument("source", type=Path)
    req.add_argument("quant", choices=sorted(FTYPES))
    req.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.command == "requantize":
        quantize(args.source, args.out, args.quant)
    elif args.quant == "F16":
        write_random(SHAPES[args.shape], args.out)
    else:
        with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
            f16 = Path(tmp) / "f16.gguf"
            write_random(SHAPES[args.shape], f16)
            quantize(f16, args.out, args.quant)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
