"""Options the commands share."""

from __future__ import annotations

from typing import Annotated

import typer

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help=(
            "A checkpoint folder, a .gguf file or a Hub id (org/name, or org/name:QUANT for one file of a GGUF "
            "repo: the HF cache, else downloaded) [default: the embedded SmolLM2-135M-Instruct]"
        ),
    ),
]
QuantOpt = Annotated[
    str | None,
    typer.Option(
        "--quant",
        "-q",
        help=(
            "Weight format: stored (a .gguf file's own types, read in place, as llama.cpp runs them), fp32, "
            "bf16, int8 (per channel) or int4 (blocks of 32) [default: stored for a .gguf file; for a "
            "checkpoint folder int4, the fastest format within the quality gates (top-1 agreement with fp32 "
            "96.9%, perplexity +0.3% on SmolLM2), or fp32 where a matrix's rows are not whole blocks of 32]"
        ),
    ),
]
DeviceOpt = Annotated[str, typer.Option("--device", "-d", help="Where to run: cpu (or auto)")]
MaxOpt = Annotated[int, typer.Option("--max-new-tokens", "-n", min=0, help="Tokens to generate at most")]
