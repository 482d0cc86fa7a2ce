"""Tool calls without a server: which way a request calls tools, what a template without tools is
told, and how answers in each format are read back."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torchburn_llm import LLM, chat_template, default_model_path
from torchburn_serve import grammar, protocol, tools
from torchburn_serve.errors import APIError
from torchburn_serve.jobs import JobMaker
from torchburn_serve.limits import Limits

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# a template that knows nothing of tools
PLAIN = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
# a Hermes-style template that formats tools itself (as Qwen's do)
HERMES = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    'Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>\n{% endif %}'
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_plan_picks_the_native_format_only_where_the_template_knows_tools() -> None:
    offered = tools.parse_tools([WEATHER])
    native = tools.plan(offered, "auto", template_knows_tools=True)
    assert native is not None and native.native and native.schema is None
    generic = tools.plan(offered, "auto", template_knows_tools=False)
    assert generic is not None and not generic.native and not generic.required
    assert generic.schema is not None and "anyOf" in generic.schema
    # a required call is enforced by the grammar whatever the template
    required = tools.plan(offered, "required", template_knows_tools=True)
    assert required is not None and not required.native and required.required
    assert tools.plan(offered, "none", template_knows_tools=True) is None
    assert tools.plan((), None, template_knows_tools=True) is None


def test_an_answer_makes_one_call_unless_parallel_calls_are_asked_for() -> None:
    offered = tools.parse_tools([WEATHER])
    for choice in ("auto", "required"):
        one = tools.plan(offered, choice, template_knows_tools=False)
        many = tools.plan(offered, choice, template_knows_tools=False, parallel=True)
        assert one is not None and one.schema is not None and many is not None and many.schema is not None
        calls = one.schema if choice == "required" else one.schema["anyOf"][0]
        assert calls["properties"]["tool_calls"]["maxItems"] == 1
        calls = many.schema if choice == "required" else many.schema["anyOf"][0]
        assert "maxItems" not in calls["properties"]["tool_calls"]


def test_objects_listing_their_properties_are_closed_to_others() -> None:
    point = {"type": "object", "properties": {"x": {"type": "number"}}}
    schema = {
        "type": "object",
        # a property named "properties", an open map, and one explicitly open object
        "properties": {
            "properties": point,
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            "extra": {**point, "additionalProperties": True},
            "list": {"type": "array", "items": point, "prefixItems": [point]},
            "either": {"anyOf": [point, {"type": "null"}]},
            "both": {"allOf": [point, {"properties": {"y": {"type": "number"}}}]},
            "fixed": {"const": {"properties": 1}},
            "ref": {"$ref": "#/$defs/p"},
        },
        "$defs": {"p": point},
    }
    closed = grammar.closed_objects(schema)
    props = closed["properties"]
    assert closed["additionalProperties"] is False
    assert props["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in props  # the mapping of names is not a schema
    assert props["tags"]["additionalProperties"] == {"type": "string"}
    assert props["extra"]["additionalProperties"] is True
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["list"]["prefixItems"][0]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False
    assert all("additionalProperties" not in part for part in props["both"]["allOf"])
    assert props["fixed"] == {"const": {"properties": 1}}
    assert closed["$defs"]["p"]["additionalProperties"] is False
    assert "additionalProperties" not in schema["properties"]["properties"]  # the caller's schema is left as it was


@pytest.mark.parametrize(
    ("raw", "choice"),
    [
        ([{"type": "function", "function": {"name": "bad name!"}}], "auto"),
        ([{"type": "retrieval"}], "auto"),
        ([WEATHER, WEATHER], "auto"),
        ([WEATHER], {"type": "function", "function": {"name": "other"}}),
        ([WEATHER], "sometimes"),
        (None, "required"),
    ],
)
def test_bad_tools_are_400(raw: object, choice: object) -> None:
    with pytest.raises(APIError) as info:
        tools.plan(tools.parse_tools(raw), choice, template_knows_tools=False)
    assert info.value.status == 400


def test_native_template_sees_the_tools_and_earlier_calls() -> None:
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
        },
        {"role": "tool", "content": "-3 C", "tool_call_id": "c1"},
    ]
    prompt = chat_template.render(HERMES, messages, True, tools=[WEATHER])
    assert json.dumps(WEATHER) in prompt  # the definition as transformers' tojson writes it: keys in order
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert f"<tool_call>{json.dumps(call)}</tool_call>" in prompt  # arguments as an object
    assert prompt.endswith("<|im_start|>tool\n-3 C<|im_end|>\n<|im_start|>assistant\n")


def test_reading_native_answers() -> None:
    plan = tools.plan(tools.parse_tools([WEATHER]), "auto", template_knows_tools=True)
    assert plan is not None
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    content, calls = tools.read_answer(text, plan)
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Rome"})
    ]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    # Llama 3.1: the call as the whole answer, with "parameters"
    content, calls = tools.read_answer('{"name": "get_weather", "parameters": {"city": "Lima"}}', plan)
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Lima"}
    # an unknown name or plain prose stays text
    assert tools.read_answer('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', plan)[1] == []
    assert tools.read_answer("It is sunny.", plan) == ("It is sunny.", [])


@pytest.mark.parametrize(
    "text",
    [
        # Mistral Nemo / Small 3: [TOOL_CALLS] and a list, the marker a special token (gone) or text
        '[{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "a1b2c3d4e"}, '
        '{"name": "get_time", "arguments": {"city": "Oslo"}, "id": "f5g6h7i8j"}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "get_time", "arguments": {"city": "Oslo"}}]',
        # later Mistral models: [TOOL_CALLS]name[ARGS]{...} per call
        'get_weather{"city": "Rome"}get_time{"city": "Oslo"}',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]get_time[ARGS]{"city": "Oslo"}',
    ],
)
def test_reading_mistral_call_lists(text: str) -> None:
    time = {**WEATHER, "function": {**WEATHER["function"], "name": "get_time"}}  # type: ignore[dict-item]
    plan = tools.plan(tools.parse_tools([WEATHER, time]), "auto", template_knows_tools=True)
    assert plan is not None
    content, calls = tools.read_answer(text, plan)
    assert content is None
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert got == [("get_weather", {"city": "Rome"}), ("get_time", {"city": "Oslo"})]
    # a list holding anything but calls of offered tools, or a name that is not offered, stays text
    for other in ('[{"name": "get_weather", "arguments": {}}, 3]', 'nope{"city": "Rome"}', "[1, 2]"):
        assert tools.read_answer(other, plan) == (other, [])


def test_templates_get_tool_call_ids_mistral_takes() -> None:
    # Mistral's templates refuse any id but nine letters and digits; a client's ids map to such, the
    # same in the call and in its result
    assert protocol.template_call_id("a1b2c3d4e") == "a1b2c3d4e"
    mapped = protocol.template_call_id("call_3f2a9c41d0e8b7a6c5d4e3f2")
    assert re.fullmatch("[0-9a-f]{9}", mapped) and mapped == protocol.template_call_id("call_3f2a9c41d0e8b7a6c5d4e3f2")
    assert protocol.template_call_id("call_other") != mapped
    request = protocol.ChatRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "Weather in Oslo?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_x", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "content": "-3 C", "tool_call_id": "call_x"},
            ]
        }
    )
    plain = request.plain_messages(native_tools=True)
    assert plain[1]["tool_calls"][0]["id"] == plain[2]["tool_call_id"] == protocol.template_call_id("call_x")


def test_generic_format_messages_and_answers() -> None:
    plan = tools.plan(tools.parse_tools([WEATHER]), "auto", template_knows_tools=False)
    assert plan is not None
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        },
        {"role": "tool", "content": "-3 C", "tool_call_id": "c1"},
    ]
    out = tools.generic_messages(history, plan)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n")
    assert '"get_weather"' in out[0]["content"] and '{"response":' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
    assert out[3]["role"] == "user"
    assert json.loads(out[3]["content"]) == {"tool_response": {"tool_call_id": "c1", "content": "-3 C"}}
    content, calls = tools.read_answer('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}', plan)
    assert content is None and calls[0]["function"]["name"] == "get_weather"
    assert tools.read_answer('{"response": "It is cold."}', plan) == ("It is cold.", [])
    assert tools.read_answer('{"tool_ca', plan) == ('{"tool_ca', [])  # cut short: kept as text


def test_a_models_tool_use_template_formats_requests_with_tools(tmp_path: Path) -> None:
    # Hermes 2 Pro and Command-R ship a template for requests with tools apart from their chat template
    transformers = pytest.importorskip("transformers")
    gguf = default_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(tmp_path)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path, safe_serialization=True)
    (tmp_path / "chat_template.jinja").write_text(PLAIN)
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(HERMES)
    maker = JobMaker(LLM.from_pretrained(tmp_path), Limits())
    assert maker.template_knows_tools  # the default template does not read tools; the tool-use one does
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    with_tools = protocol.ChatRequest.model_validate({"messages": messages, "tools": [WEATHER]})
    text, plan = maker.chat_prompt(with_tools)
    assert plan is not None and plan.native and text.startswith("<|im_start|>system\nTools:\n" + json.dumps(WEATHER))
    text, plan = maker.chat_prompt(protocol.ChatRequest.model_validate({"messages": messages}))
    assert plan is None and text == "user: Weather in Oslo?\nassistant:"
