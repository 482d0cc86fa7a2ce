"""llama-server's own ``/completion``, ``/props``, ``/apply-template`` and ``/v1/health`` with ``httpx``,
as its scripts and editor plugins call them: answers checked against the same model run in this process
(greedy, so the text must be the same)."""

from __future__ import annotations

import json

import httpx
import pytest

from helpers import CITY_SCHEMA
from serve_process import ServerProcess
from torchburn_llm import LLM

PROMPT = "The capital of France is"


def test_completion_is_the_models_greedy_continuation(server: ServerProcess, llm: LLM) -> None:
    r = httpx.post(server.url + "/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    answer = r.json()
    assert answer["content"] == llm.generate(PROMPT, 8, temperature=0)
    assert answer["stop"] is True and answer["stop_type"] == "limit" and answer["tokens_predicted"] == 8
    assert answer["tokens_evaluated"] == len(llm.prompt_ids(PROMPT))
    assert answer["timings"]["predicted_n"] == 8 and answer["timings"]["predicted_ms"] > 0
    # the prompt as token ids gives the same continuation
    ids = httpx.post(
        server.url + "/completion",
        json={"prompt": llm.prompt_ids(PROMPT), "n_predict": 8, "temperature": 0},
        timeout=60,
    ).json()
    assert ids["content"] == answer["content"]


def test_streamed_completion_joins_to_the_whole_answer(server: ServerProcess) -> None:
    body = {"prompt": PROMPT, "n_predict": 6, "temperature": 0}
    whole = httpx.post(server.url + "/completion", json=body, timeout=60).json()
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True}, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == 6


def test_json_schema_output_parses_and_validates(server: ServerProcess) -> None:
    schema = CITY_SCHEMA
    body = {"prompt": "Paris as JSON:", "temperature": 0, "json_schema": schema}
    value = json.loads(httpx.post(server.url + "/completion", json=body, timeout=120).json()["content"])
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())


def test_props_describe_the_served_model(server: ServerProcess, llm: LLM) -> None:
    props = httpx.get(server.url + "/props", timeout=10).json()
    assert props["default_generation_settings"]["n_ctx"] == llm.config.max_position
    assert props["chat_template"] == llm.chat_template and props["total_slots"] >= 1


def test_apply_template_gives_the_prompt_a_chat_request_runs(server: ServerProcess, llm: LLM) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = httpx.post(server.url + "/apply-template", json={"messages": messages}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": llm.apply_chat_template(messages, True)}
    # the prompt it gives is the one the chat route counts
    chat = httpx.post(
        server.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=60
    ).json()
    assert chat["usage"]["prompt_tokens"] == len(llm.encode(r.json()["prompt"]))
    bad = httpx.post(server.url + "/apply-template", json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_v1_health_answers_as_health(server: ServerProcess) -> None:
    health = httpx.get(server.url + "/v1/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["model"] == httpx.get(server.url + "/health", timeout=10).json()["model"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": PROMPT, "grammar": "root ::= [a-z]+"}, "grammar"),
        ({"prompt": PROMPT, "n_predict": 0}, "n_predict"),
        ({"prompt": [1, -5]}, "prompt"),
        ({"n_predict": 4}, "prompt"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server: ServerProcess, body: dict[str, object], param: str) -> None:
    r = httpx.post(server.url + "/completion", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "Traceback" not in r.text
