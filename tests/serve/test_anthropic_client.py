"""The official ``anthropic`` client against ``torchburn serve``'s Messages API: answers checked against the
same model run in this process (greedy, so the text must be the same) and against the chat completions
route's answer to the same conversation."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from serve_process import ServerProcess
from torchburn_llm import LLM

QUESTION = "What is the capital of France?"
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# greedy sampling: the client no longer sends temperature itself, so it goes in the body as older ones sent it
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}


def client(server: ServerProcess, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


def chat_client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_answer_is_the_models_greedy_answer(server: ServerProcess, llm: LLM) -> None:
    reply = client(server).messages.create(
        model="m", max_tokens=24, **GREEDY, messages=[{"role": "user", "content": QUESTION}]
    )
    messages = [{"role": "user", "content": QUESTION}]
    want = llm.chat_completion(messages, max_new_tokens=24, temperature=0)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == want  # type: ignore[union-attr]
    prompt = len(llm.prompt_ids(llm.apply_chat_template(messages)))
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) == prompt
    assert reply.usage.output_tokens == len(llm.encode(want))
    # the chat route's finish, in Anthropic's words
    chat = chat_client(server).chat.completions.create(model="m", messages=messages, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    finish = {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert reply.stop_reason == finish and reply.stop_sequence is None


def test_system_blocks_and_turns_are_the_conversation(server: ServerProcess, llm: LLM) -> None:
    reply = client(server).messages.create(
        model="m",
        max_tokens=16,
        **GREEDY,
        system=[{"type": "text", "text": "Answer briefly."}],
        messages=[
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": [{"type": "text", "text": "Apple."}]},
            {"role": "user", "content": [{"type": "text", "text": "Another one?"}]},
        ],
    )
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another one?"},
    ]
    assert reply.content[0].text == llm.chat_completion(messages, max_new_tokens=16, temperature=0)  # type: ignore[union-attr]


def test_a_final_assistant_turn_is_continued(server: ServerProcess, llm: LLM) -> None:
    start = "The capital of France is"
    reply = client(server).messages.create(
        model="m",
        max_tokens=12,
        **GREEDY,
        messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": start}],
    )
    prompt = llm.apply_chat_template([{"role": "user", "content": QUESTION}]) + start
    want = str(llm.tokenizer.decode(llm.generate_ids(llm.prompt_ids(prompt), 12), skip_special_tokens=True))
    assert reply.content[0].text == want  # type: ignore[union-attr]
    # the chat route continues it alike, as llama-server does
    chat = chat_client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": QUESTION}, {"role": "assistant", "content": start}],
        max_tokens=12,
        **GREEDY,
    )
    assert chat.choices[0].message.content == want


def test_stream_events_build_the_whole_message(server: ServerProcess) -> None:
    request = {"model": "m", "max_tokens": 20, **GREEDY, "messages": [{"role": "user", "content": QUESTION}]}
    whole = client(server).messages.create(**request)  # type: ignore[call-overload]
    events = list(client(server).messages.create(**request, stream=True))  # type: ignore[call-overload]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == whole.content[0].text
    assert events[-2].delta.stop_reason == whole.stop_reason
    assert events[-2].usage.output_tokens == whole.usage.output_tokens
    # the client's own accumulation of the events
    with client(server).messages.stream(**request) as stream:
        assert "".join(stream.text_stream) == whole.content[0].text
        final = stream.get_final_message()
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason  # type: ignore[union-attr]


def test_stop_sequences_end_the_answer_and_are_named(server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Tell me about Paris."}]
    free = client(server).messages.create(model="m", max_tokens=30, **GREEDY, messages=messages)  # type: ignore[arg-type]
    text = free.content[0].text  # type: ignore[union-attr]
    word = text.split()[3]
    stopped = client(server).messages.create(
        model="m",
        max_tokens=30,
        **GREEDY,
        messages=messages,  # type: ignore[arg-type]
        stop_sequences=["\u2603", word],
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[: text.index(word)]  # type: ignore[union-attr]
    events = list(
        client(server).messages.create(
            model="m",
            max_tokens=30,
            **GREEDY,
            messages=messages,  # type: ignore[arg-type]
            stop_sequences=[word],
            stream=True,
        )
    )
    assert events[-2].delta.stop_reason == "stop_sequence" and events[-2].delta.stop_sequence == word  # type: ignore[union-attr]


def test_tool_use_and_its_result_as_chat_completions_answer(server: ServerProcess) -> None:
    c = client(server)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    reply = c.messages.create(
        model="m",
        max_tokens=100,
        **GREEDY,
        messages=[question],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert reply.stop_reason == "tool_use"
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    assert set(uses[0].input) == {"city"} and isinstance(uses[0].input["city"], str)  # type: ignore[arg-type]
    # streamed, the client assembles the same call from its input_json_delta
    with c.messages.stream(
        model="m",
        max_tokens=100,
        **GREEDY,
        messages=[question],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        final = stream.get_final_message()
    streamed_uses = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed_uses] == [(uses[0].name, uses[0].input)]
    assert final.stop_reason == "tool_use"
    # the call and its result go back; the answer is the chat route's to the same turns
    follow = c.messages.create(
        model="m",
        max_tokens=30,
        **GREEDY,
        tools=[WEATHER],  # type: ignore[list-item]
        messages=[
            question,  # type: ignore[list-item]
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 C, sunny"}]},
        ],
    )
    tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                             "parameters": WEATHER["input_schema"]}}  # fmt: skip
    call = {"id": uses[0].id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps(uses[0].input)}}  # fmt: skip
    chat = chat_client(server).chat.completions.create(
        model="m",
        max_tokens=30,
        **GREEDY,
        tools=[tool],  # type: ignore[list-item]
        messages=[
            question,  # type: ignore[list-item]
            {"role": "assistant", "content": None, "tool_calls": [call]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": uses[0].id, "content": "18 C, sunny"},
        ],
    )
    texts = [b.text for b in follow.content if b.type == "text"]
    calls = [b for b in follow.content if b.type == "tool_use"]
    assert texts == ([chat.choices[0].message.content] if chat.choices[0].message.content else [])
    assert [b.name for b in calls] == [c.function.name for c in chat.choices[0].message.tool_calls or []]


def test_any_tool_choice_requires_a_call(server: ServerProcess) -> None:
    reply = client(server).messages.create(
        model="m",
        max_tokens=100,
        **GREEDY,
        messages=[{"role": "user", "content": "Hello!"}],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    )
    assert reply.stop_reason == "tool_use" and [b.type for b in reply.content] == ["tool_use"]


def test_output_format_json_schema_parses_and_validates(server: ServerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    reply = client(server).messages.create(
        model="m",
        max_tokens=80,
        **GREEDY,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    value = json.loads(reply.content[0].text)  # type: ignore[union-attr]
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())
    assert reply.stop_reason == "end_turn"


def test_count_tokens_is_the_prompts_length(server: ServerProcess, llm: LLM) -> None:
    messages = [{"role": "user", "content": QUESTION}]
    counted = client(server).messages.count_tokens(model="m", system="Be brief.", messages=messages)  # type: ignore[arg-type]
    chat = [{"role": "system", "content": "Be brief."}, *messages]
    assert counted.input_tokens == len(llm.prompt_ids(llm.apply_chat_template(chat)))
    with_tools = client(server).messages.count_tokens(model="m", messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    assert with_tools.input_tokens > len(llm.prompt_ids(llm.apply_chat_template(messages)))


def test_models_list_reads_as_anthropic_models(server: ServerProcess) -> None:
    models = list(client(server).models.list())
    assert [m.id for m in models] == [chat_client(server).models.list().data[0].id]
    assert models[0].type == "model" and models[0].created_at.year >= 2024


@pytest.mark.parametrize(
    ("content", "tools", "says"),
    [
        ([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}], None, "image"),
        ("Hi", [{"type": "web_search_20250305", "name": "web_search"}], "server tool"),
        ([{"type": "tool_result", "content": "x"}], None, "tool_use_id"),
    ],
)
def test_what_cannot_run_is_an_anthropic_400(server: ServerProcess, content: object, tools: object, says: str) -> None:
    extra = {} if tools is None else {"tools": tools}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client(server).messages.create(
            model="m",
            max_tokens=8,
            messages=[{"role": "user", "content": content}],  # type: ignore[typeddict-item]
            **extra,  # type: ignore[arg-type]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and says in body["error"]["message"]


def test_api_key_from_x_api_key(start_server: object) -> None:
    server: ServerProcess = start_server("--api-key", "sesame")  # type: ignore[operator]
    with pytest.raises(anthropic.AuthenticationError) as caught:
        client(server, key="wrong").messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
        )
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    reply = client(server, key="sesame").messages.create(
        model="m", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.usage.output_tokens >= 1
    # the other routes take the header too, and still refuse a wrong one
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": "sesame"}).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"x-api-key": "nope"}).status_code == 401
