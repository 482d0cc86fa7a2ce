"""The official ``openai`` client's Responses API against ``torchburn serve``: answers checked against the
same model run in this process (greedy, so the text must be the same) and against the chat completions
route's answer to the same conversation."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from helpers import CITY_SCHEMA
from serve_process import ServerProcess
from torchburn_llm import LLM

QUESTION = "What is the capital of France?"
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "The current time in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_text_input_is_the_models_greedy_answer(server: ServerProcess, llm: LLM) -> None:
    reply = client(server).responses.create(model="m", input=QUESTION, max_output_tokens=24, temperature=0)
    messages = [{"role": "user", "content": QUESTION}]
    want = llm.chat_completion(messages, max_new_tokens=24, temperature=0)
    assert reply.output_text == want and reply.status == "completed"
    assert reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.usage is not None
    assert reply.usage.input_tokens == len(llm.encode(llm.apply_chat_template(messages)))
    assert reply.usage.output_tokens == len(llm.encode(want))
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens


def test_instructions_and_message_items_are_the_conversation(server: ServerProcess, llm: LLM) -> None:
    turns = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Apple."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Another one?"}]},
    ]
    reply = client(server).responses.create(
        model="m",
        instructions="Answer briefly.",
        input=turns,
        max_output_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another one?"},
    ]
    assert reply.output_text == llm.chat_completion(messages, max_new_tokens=16, temperature=0)


def test_stream_events_build_the_whole_response(server: ServerProcess) -> None:
    whole = client(server).responses.create(model="m", input=QUESTION, max_output_tokens=20, temperature=0)
    events = list(
        client(server).responses.create(model="m", input=QUESTION, max_output_tokens=20, temperature=0, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == whole.output_text
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]


def test_a_cut_off_answer_is_incomplete(server: ServerProcess) -> None:
    reply = client(server).responses.create(model="m", input="Tell me a long story.", max_output_tokens=3)
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens" and reply.usage.output_tokens == 3  # type: ignore[union-attr]
    events = list(
        client(server).responses.create(model="m", input="Tell me a story.", max_output_tokens=2, stream=True)
    )
    assert events[-1].type == "response.incomplete"


def test_json_schema_format_parses_and_validates(server: ServerProcess) -> None:
    schema = CITY_SCHEMA
    reply = client(server).responses.create(
        model="m",
        input="Describe Paris as JSON.",
        temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )
    value = json.loads(reply.output_text)
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())


def test_function_call_and_its_output_as_chat_completions_answer(server: ServerProcess) -> None:
    c = client(server)
    reply = c.responses.create(
        model="m",
        input="What time is it in Tokyo?",
        tools=[TIME],
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=200,
        temperature=0,  # type: ignore[list-item]
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_time"  # type: ignore[union-attr]
    assert isinstance(json.loads(calls[0].arguments)["city"], str)  # type: ignore[union-attr]
    # the call and its output go back as input; the answer is the chat route's to the same turns
    follow_input = [{"role": "user", "content": "What time is it in Tokyo?"}, *reply.output,
                    {"type": "function_call_output", "call_id": calls[0].call_id, "output": "10:42"}]  # type: ignore[union-attr]  # fmt: skip
    follow = c.responses.create(
        model="m",
        input=follow_input,
        tools=[TIME],
        max_output_tokens=40,
        temperature=0,  # type: ignore[arg-type,list-item]
    )
    chat_tool = {"type": "function", "function": {k: TIME[k] for k in ("name", "description", "parameters")}}
    chat = (
        c.chat.completions.create(
            model="m",
            messages=[
                {"role": "user", "content": "What time is it in Tokyo?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": x.call_id, "type": "function", "function": {"name": x.name, "arguments": x.arguments}}  # type: ignore[union-attr]
                        for x in calls
                    ],
                },
                {"role": "tool", "tool_call_id": calls[0].call_id, "content": "10:42"},  # type: ignore[union-attr]
            ],
            tools=[chat_tool],  # type: ignore[list-item]
            max_tokens=40,
            temperature=0,
        )
        .choices[0]
        .message
    )
    assert follow.output_text == (chat.content or "")
    follow_calls = [(x.name, x.arguments) for x in follow.output if x.type == "function_call"]  # type: ignore[union-attr]
    assert follow_calls == [(t.function.name, t.function.arguments) for t in chat.tool_calls or []]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0]"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": [{"type": "web_search_call"}]}, "input[0]"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server: ServerProcess, body: dict[str, object], param: str) -> None:
    r = httpx.post(server.url + "/v1/responses", json={"model": "m", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "Traceback" not in r.text
