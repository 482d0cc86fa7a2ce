"""``GET /metrics``: the server's counters and gauges in Prometheus' text format, as llama-server's
``--metrics`` and vLLM serve them, for a scraper and a dashboard: tokens read and generated, requests
by how they ended, the batch, the KV and prefix caches."""

from __future__ import annotations

from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (name, type, help, the engine stat it reads)
_ENGINE_SERIES = (
    ("prompt_tokens_total", "counter", "Prompt tokens computed.", "prompt_tokens"),
    (
        "cached_prompt_tokens_total",
        "counter",
        "Prompt tokens whose keys and values came from the prefix cache instead.",
        "cached_prompt_tokens",
    ),
    ("generated_tokens_total", "counter", "Tokens generated into answers.", "generated_tokens"),
    ("decode_steps_total", "counter", "Batched decode steps run.", "decode_steps"),
    ("decode_step_tokens_total", "counter", "Tokens those decode steps computed.", "decode_step_tokens"),
    ("prefill_rounds_total", "counter", "Prefill rounds run, each of one or more prompts.", "prefill_rounds"),
    ("prefill_prompts_total", "counter", "Prompts those rounds ran.", "prefill_prompts"),
    ("requests_decoding", "gauge", "Requests in the decode batch.", "requests_decoding"),
    ("requests_waiting", "gauge", "Requests waiting for a place in the batch.", "requests_waiting"),
    ("kv_cache_bytes", "gauge", "Bytes of KV cache the running requests hold.", "kv_cache_bytes"),
    ("prefix_cache_entries", "gauge", "Finished requests' KV caches kept for their prefixes.", "prefix_cache_entries"),
    ("prefix_cache_bytes", "gauge", "Bytes those caches hold.", "prefix_cache_bytes"),
)


def text(server: Any) -> str:
    """Every series of ``server`` (an :class:`~torchburn_serve.app.Server`) in the exposition format."""
    stats = server.engine.stats()
    lines: list[str] = []

    def series(name: str, kind: str, about: str, samples: list[tuple[str, int | float]]) -> None:
        lines.extend((f"# HELP torchburn_{name} {about}", f"# TYPE torchburn_{name} {kind}"))
        lines.extend(f"torchburn_{name}{labels} {value}" for labels, value in samples)

    model = server.llm.model
    info = f'{{model="{_escaped(server.model_id)}",quant="{_escaped(str(model.quant))}"}}'
    series("model_info", "gauge", "The served model.", [(info, 1)])
    series("requests_in_flight", "gauge", "Requests the server is answering.", [("", server.in_flight)])
    for name, kind, about, stat in _ENGINE_SERIES:
        series(name, kind, about, [("", stats[stat])])
    ended = [(f'{{reason="{reason}"}}', n) for reason, n in sorted(server.engine.finished.items())]
    series("requests_finished_total", "counter", "Generations ended, by how: stop, length or error.", ended)
    return "\n".join(lines) + "\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
