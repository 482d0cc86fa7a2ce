"""``GET /metrics`` read by Prometheus' own parser, its counts checked against the usage the answers
reported."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from serve_process import ServerProcess


def _samples(server: ServerProcess, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = httpx.get(server.url + "/metrics", headers=headers, timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def test_counts_are_the_answers_usage(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server()
    url = server.url + "/v1/chat/completions"
    question = [{"role": "user", "content": "What is the capital of France?"}]
    usages = []
    for max_tokens in (24, 24, 3):  # the second reads its prompt from the prefix cache; the third is cut
        body = {"messages": question, "max_tokens": max_tokens, "temperature": 0}
        usages.append(httpx.post(url, json=body, timeout=60).json()["usage"])
    got = _samples(server)
    prompt = sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0
    assert got[("torchburn_generated_tokens_total", ())] == sum(u["completion_tokens"] for u in usages)
    assert got[("torchburn_cached_prompt_tokens_total", ())] == cached
    assert got[("torchburn_prompt_tokens_total", ())] == prompt - cached
    assert got[("torchburn_requests_finished_total", (("reason", "length"),))] >= 1
    finished = sum(v for (name, _), v in got.items() if name == "torchburn_requests_finished_total")
    assert finished == 3 and got[("torchburn_requests_in_flight", ())] == 0
    assert got[("torchburn_prefill_prompts_total", ())] == 3
    card = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]
    assert got[("torchburn_model_info", (("model", card["id"]), ("quant", card["meta"]["quant"])))] == 1


def test_metrics_need_the_key(start_server: Callable[..., ServerProcess]) -> None:
    server = start_server("--api-key", "sesame")
    assert httpx.get(server.url + "/metrics", timeout=30).status_code == 401
    assert _samples(server, authorization="Bearer sesame")[("torchburn_requests_in_flight", ())] == 0
