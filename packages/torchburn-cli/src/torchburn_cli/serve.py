"""``torchburn serve``: the model behind an OpenAI-compatible HTTP API and a chat page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from .options import DeviceOpt, ModelOpt, QuantOpt


def model_name(model: str | None) -> str:
    """The name clients see in ``/v1/models``: a Hub id as given, a file or folder by its name."""
    if model is None:
        return "SmolLM2-135M-Instruct"
    path = Path(model)
    if path.exists():
        return path.name.removesuffix(".gguf")
    return model


def serve(
    model: ModelOpt = None,
    quant: QuantOpt = None,
    device: DeviceOpt = "cpu",
    host: Annotated[str, typer.Option(help="Address to listen on (another than loopback exposes the model)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="TORCHBURN_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every route (the page asks for it as a password)",
        ),
    ] = None,
    alias: Annotated[str | None, typer.Option(help="The model's name in the API [default: from --model]")] = None,
    max_batch: Annotated[int, typer.Option(min=1, help="Sequences decoded together in one step")] = 16,
    max_requests: Annotated[int, typer.Option(min=1, help="Requests in flight; more are refused with 429")] = 64,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens one request may generate")] = 2048,
    max_prompt_tokens: Annotated[
        int | None, typer.Option(min=1, help="Prompt tokens one request may send [default: the context less one]")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body accepted")] = 1 << 20,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--cors-origin",
            help="Also let web pages from this origin call the API from a browser (e.g. https://chat.example, "
            "or '*' for any; repeatable). Pages on localhost / 127.0.0.1 always may",
        ),
    ] = None,
) -> None:
    """Serve the model over the OpenAI API (chat and text completions, embeddings) with a chat page at /."""
    from torchburn_serve import Limits, run

    for origin in cors_origin or ():
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise typer.BadParameter(
                f"{origin!r} is not a web origin: give scheme://host[:port] with no path (or '*')",
                param_hint="--cors-origin",
            )
    from .app import _load

    limits = Limits(
        max_body_bytes=max_body_bytes,
        max_prompt_tokens=max_prompt_tokens,
        max_tokens=max_tokens,
        max_requests=max_requests,
        max_batch=max_batch,
    )
    llm = _load(model, quant, device)
    run(
        llm,
        alias or model_name(model),
        host=host,
        port=port,
        api_key=api_key,
        limits=limits,
        cors_origins=cors_origin or (),
    )


def bench_serve(
    model: ModelOpt = None,
    clients: Annotated[str, typer.Option(help="Concurrent streaming clients per round, comma-separated")] = "1,4,16",
    requests: Annotated[int, typer.Option(min=1, help="Requests each client sends, one after the other")] = 2,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens each request generates at most (greedy)")] = 128,
    llama_cpp: Annotated[
        bool,
        typer.Option(
            "--llama-cpp/--no-llama-cpp",
            help="Also run llama-cpp-python's OpenAI server on the same GGUF file and threads "
            "(needs the llama-cpp extra of torchburn-serve)",
        ),
    ] = False,
    logs: Annotated[Path, typer.Option(help="Where the servers' logs go")] = Path("bench-results/serve-logs"),
) -> None:
    """Aggregate tokens/s and time to first token of 1, 4, 16 concurrent streaming clients against
    `torchburn serve` (and llama-cpp-python's server), each server alone on the machine."""
    import torch

    from torchburn_llm import default_model_path
    from torchburn_serve import bench

    try:
        counts = [int(c) for c in clients.split(",")]
    except ValueError:
        raise ValueError(f"--clients takes comma-separated numbers, got {clients!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--clients takes numbers of at least 1, got {clients!r}")
    path = Path(model) if model else default_model_path()
    gguf = None
    if llama_cpp:
        if path.suffix != ".gguf":
            raise ValueError(f"--llama-cpp compares on a .gguf file; {path} is not one")
        gguf = path
    threads = torch.get_num_threads()
    print(f"model: {path.name}; {threads} threads; {requests} requests per client of at most {max_tokens} tokens")
    print(bench.HEADER)
    bench.run(model, gguf, counts, requests, max_tokens, threads, logs)
