"""``torchburn pull``, ``list`` and ``rm``: models in the Hugging Face cache, managed as ollama manages its
own. The cache is huggingface_hub's (``HF_HUB_CACHE``, else ``HF_HOME/hub``), so a pulled model is also
there for transformers and llama.cpp's ``-hf``, and theirs for TorchBurn."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Annotated

import typer

ModelArg = Annotated[
    str,
    typer.Argument(
        metavar="ORG/NAME[:QUANT]",
        help="A Hub model; :QUANT (Q4_K_M, q8_0, ...) picks that file of a GGUF repo",
        show_default=False,
    ),
]


def pull(
    model: ModelArg,
    revision: Annotated[str | None, typer.Option(help="Branch, tag or commit [default: main]")] = None,
) -> None:
    """Download a model into the Hugging Face cache: a GGUF repo's file for QUANT (without one, Q4_K_M
    if there is one, else the only .gguf), else the checkpoint's configs, tokenizer and safetensors
    (never pickled weights or code)."""
    from torchburn_llm import hub
    from torchburn_llm.gguf_quants import merge_hint
    from torchburn_llm.hub_cache import human_size

    pulled = hub.pull(model, revision=revision)
    parts = f" ({len(pulled.files)} parts)" if pulled.split else ""
    print(f"{pulled.name}{parts}: {human_size(pulled.size)} at {pulled.path}")
    if pulled.split:
        print(f"split GGUF files cannot be loaded yet: {merge_hint(pulled.path)}")
    elif revision is None:
        print(f'run it: torchburn generate --model {pulled.name} "Hello"')
    else:
        print(f'run it from Python: torchburn.LLM.from_pretrained("{pulled.name}", revision="{revision}")')


def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array of objects, for scripts")] = False,
) -> None:
    """The models in the Hugging Face cache: one row per GGUF quant and per checkpoint, with its format,
    size on disk and when it was last changed."""
    from torchburn_llm.hub_cache import cache_dir, cached_models, human_size

    rows = cached_models()
    if as_json:
        print(json.dumps([r.as_json() for r in rows], indent=2))
        return
    if not rows:
        print(f"no models in the Hugging Face cache ({cache_dir()}); get one with: torchburn pull ORG/NAME[:QUANT]")
        return
    table = [("NAME", "FORMAT", "SIZE", "MODIFIED")] + [
        (r.name, r.kind, human_size(r.size), datetime.fromtimestamp(r.modified).strftime("%Y-%m-%d %H:%M"))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for name, kind, size, modified in table:
        print(f"{name:<{widths[0]}}  {kind:<{widths[1]}}  {size:>{widths[2]}}  {modified}")


def rm(
    model: ModelArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking")] = False,
) -> None:
    """Delete a model from the Hugging Face cache: the whole repo (every revision and quant), or with
    :QUANT only that GGUF file (its blob too, unless another revision links it)."""
    from torchburn_llm import hub
    from torchburn_llm.hub_cache import human_size, plan_removal

    repo_id, quant = hub.split_ref(model)
    removal = plan_removal(repo_id, quant)
    print(f"{removal.name}: {human_size(removal.size)} in")
    for path in removal.paths:
        print(f"  {path}")
    if not yes:
        if not sys.stdin.isatty():
            raise ValueError(f"not deleting {removal.name}: there is no terminal to confirm on; pass --yes")
        if not typer.confirm(f"delete {removal.name}?"):
            print("nothing deleted")
            raise typer.Exit(1)
    removal.execute()
    print(f"deleted {removal.name} ({human_size(removal.size)} freed)")
