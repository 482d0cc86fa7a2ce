"""The official ``ollama`` client against ``torchburn serve``'s Ollama routes: every answer is checked
against the same model run in this process (greedy, so the text must be the same) or against the
OpenAI route's answer to the same request."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest
import torch

from helpers import CITY_SCHEMA
from serve_process import ServerProcess
from torchburn_llm import LLM
from torchburn_serve import ollama as ollama_routes
from torchburn_serve import tools

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 24}


def client(server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def test_version_tags_and_show_describe_the_served_model(server: ServerProcess, llm: LLM) -> None:
    c = client(server)
    assert httpx.get(server.url + "/api/version", timeout=10).json()["version"]
    models = c.list().models
    assert [m.model for m in models] == ["SmolLM2-135M-Instruct"]
    assert models[0].details is not None and models[0].details.family == llm.architecture.name
    shown = c.show("SmolLM2-135M-Instruct")
    assert shown.template == llm.chat_template
    assert shown.modelinfo is not None and shown.modelinfo["context_length"] == llm.config.max_position


def test_requests_with_nothing_to_generate_load_or_unload(server: ServerProcess) -> None:
    for path, empty in (("/api/chat", {"messages": []}), ("/api/generate", {"prompt": ""})):
        load = httpx.post(server.url + path, json={"model": "m", **empty}, timeout=30).json()
        assert load["done"] is True and load["done_reason"] == "load"
        unload = httpx.post(server.url + path, json={"model": "m", "keep_alive": 0, **empty}, timeout=30).json()
        assert unload["done_reason"] == "unload"


def test_chat_is_the_models_greedy_answer_with_its_counts(server: ServerProcess, llm: LLM) -> None:
    reply = client(server).chat(model="smollm2", messages=QUESTION, options=GREEDY, stream=False)
    want = llm.chat_completion(QUESTION, max_new_tokens=24, temperature=0)
    assert reply.message.role == "assistant" and reply.message.content == want
    assert reply.done and reply.done_reason == "stop"
    assert reply.prompt_eval_count == len(llm.encode(llm.apply_chat_template(QUESTION)))
    assert reply.eval_count == len(llm.encode(want))
    assert reply.total_duration is not None and reply.total_duration >= (reply.eval_duration or 0) > 0


def test_streamed_chat_joins_to_the_whole_answer(server: ServerProcess, llm: LLM) -> None:
    parts = list(client(server).chat(model="m", messages=QUESTION, options={**GREEDY, "num_predict": 5}, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 5
    text = "".join(p.message.content or "" for p in parts)
    assert text == llm.chat_completion(QUESTION, max_new_tokens=5, temperature=0)
    # the raw stream: one JSON object per line
    body = {"model": "m", "messages": QUESTION, "options": {"num_predict": 3, "temperature": 0}}
    with httpx.stream("POST", server.url + "/api/chat", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and all(not x["done"] for x in lines[:-1])


def test_generate_templated_and_raw(server: ServerProcess, llm: LLM) -> None:
    c = client(server)
    reply = c.generate(model="m", prompt="Name a color.", system="Answer in one word.", options=GREEDY)
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a color."}]
    assert reply.response == llm.chat_completion(messages, max_new_tokens=24, temperature=0)
    raw = c.generate(
        model="m", prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 8}
    )
    assert raw.response == llm.generate("The capital of France is", 8, temperature=0)
    assert raw.done_reason == "length"


def test_format_schema_and_json(server: ServerProcess) -> None:
    schema = CITY_SCHEMA
    messages = [{"role": "user", "content": "Describe Paris as JSON."}]
    reply = client(server).chat(model="m", messages=messages, format=schema, options={"temperature": 0})
    value = json.loads(reply.message.content or "")
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())
    anything = client(server).chat(model="m", messages=messages, format="json", options={"temperature": 0})
    assert isinstance(json.loads(anything.message.content or ""), dict)


def test_tools_and_tool_turns_answer_as_the_openai_route(server: ServerProcess) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    history: list[dict[str, object]] = [
        {"role": "user", "content": "What time is it in Tokyo?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "get_time", "arguments": {"city": "Tokyo"}}}]},
        {"role": "tool", "content": "10:42"},
    ]  # fmt: skip
    for messages in (history[:1], history):
        got = client(server).chat(
            model="m", messages=messages, tools=[tool], options={"temperature": 0, "num_predict": 60}
        )
        as_openai = [
            {**m, "tool_calls": [{"id": "call_0", "type": "function",
                                  "function": {"name": "get_time", "arguments": json.dumps({"city": "Tokyo"})}}]}
            if m.get("tool_calls") else ({**m, "tool_call_id": "call_0"} if m["role"] == "tool" else m)
            for m in messages
        ]  # fmt: skip
        want = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
            model="m", messages=as_openai, tools=[tool], max_tokens=60, temperature=0  # type: ignore[arg-type,list-item]
        ).choices[0].message  # fmt: skip
        streamed = client(server).chat(
            model="m", messages=messages, tools=[tool], options={"temperature": 0, "num_predict": 60}, stream=True
        )
        parts = list(streamed)  # a tool-calling answer comes whole, in the last object
        assert len(parts) == 1 and parts[0].message == got.message
        assert (got.message.content or "") == (want.content or "")
        calls = [(c.function.name, dict(c.function.arguments)) for c in got.message.tool_calls or []]
        assert calls == [(c.function.name, json.loads(c.function.arguments)) for c in want.tool_calls or []]


def test_tool_calls_are_written_as_ollama_writes_them() -> None:
    """Arguments as an object, no ids, the text (none here) as the content."""
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    plan = tools.plan(tools.parse_tools([tool]), "auto", False)
    assert plan is not None
    answer = '{"tool_calls": [{"name": "get_time", "arguments": {"city": "Tokyo", "hour": 24}}]}'
    assert ollama_routes._with_calls(answer, plan, "stop") == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_time", "arguments": {"city": "Tokyo", "hour": 24}}}],
    }
    assert ollama_routes._with_calls('{"response": "It is noon."}', plan, "stop") == {
        "role": "assistant",
        "content": "It is noon.",
    }


def test_embed_is_the_openai_routes_embedding(server: ServerProcess, llm: LLM) -> None:
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    got = client(server).embed(model="m", input=texts).embeddings
    for text, vector in zip(texts, got, strict=True):
        hidden = llm.model.hidden_states(torch.tensor(llm.encode(text))).mean(0)
        torch.testing.assert_close(torch.tensor(vector), hidden / hidden.norm(), atol=1e-5, rtol=1e-4)
    old = client(server).embeddings(model="m", prompt=texts[0]).embedding
    assert list(old) == pytest.approx(list(got[0]), abs=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}]}, "images"),
        ("/api/chat", {"model": "m", "messages": QUESTION, "options": {"temperature": "hot"}}, "temperature"),
        ("/api/chat", {"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "role"),
        ("/api/generate", {"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
        ("/api/chat", {"model": "m", "messages": QUESTION, "options": {"num_predict": 100000}}, "max_tokens"),
        ("/api/chat", {"model": "m", "messages": QUESTION, "format": {"a": json.loads("[" * 70 + "]" * 70)}}, "nests"),
    ],
)
def test_bad_requests_are_ollama_errors(
    server: ServerProcess, path: str, body: dict[str, object], fragment: str
) -> None:
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and fragment in error and "Traceback" not in r.text
    with pytest.raises(ollama.ResponseError) as caught:
        client(server).chat(model="m", messages=[{"role": "user", "content": "hi", "images": [b"\x89PNG"]}])
    assert caught.value.status_code == 400 and "images" in str(caught.value.error)


def test_results_are_paired_with_the_calls_they_answer() -> None:
    # Ollama sends calls without ids and results in their order; templates that pair them (Mistral's)
    # need ids on both
    body = ollama_routes.ChatBody.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "Time in Tokyo and Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_time", "arguments": {"city": "Tokyo"}}},
                    {"function": {"name": "get_time", "arguments": {"city": "Oslo"}}},
                ]},
                {"role": "tool", "content": "10:42", "tool_name": "get_time"},
                {"role": "tool", "content": "03:42", "tool_name": "get_time"},
            ],
        }
    )  # fmt: skip
    messages = ollama_routes._chat_request(body)["messages"]
    ids = [c["id"] for c in messages[1]["tool_calls"]]
    assert len(set(ids)) == 2 and [m["tool_call_id"] for m in messages[2:]] == ids
