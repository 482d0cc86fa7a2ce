"""The official ``openai`` client against ``torchburn serve``: every answer is checked against the same
model run in this process (greedy, so the text must be the same), against ``jsonschema``-style checks
of constrained output, or against the API's error contract."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import openai
import pytest
import torch

from serve_process import ServerProcess
from torchburn_llm import LLM

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def client(server: ServerProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_models_lists_the_served_model(server: ServerProcess, llm: LLM) -> None:
    models = client(server).models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct"]
    assert client(server).models.retrieve("SmolLM2-135M-Instruct").id == "SmolLM2-135M-Instruct"
    with pytest.raises(openai.NotFoundError):
        client(server).models.retrieve("gpt-4")


def test_chat_completion_is_the_models_greedy_answer(server: ServerProcess, llm: LLM) -> None:
    reply = client(server).chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, max_tokens=24, temperature=0
    )
    want = llm.chat_completion(QUESTION, max_new_tokens=24, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == want
    assert "Paris" in want
    prompt_ids = llm.encode(llm.apply_chat_template(QUESTION))
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(prompt_ids)
    assert reply.usage.completion_tokens == len(llm.encode(want))
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert choice.finish_reason == "stop"


def test_stream_joins_to_the_whole_answer_and_reports_usage(server: ServerProcess, llm: LLM) -> None:
    messages = [{"role": "user", "content": "Name three colors."}]
    stream = client(server).chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == llm.chat_completion(messages, max_new_tokens=40, temperature=0)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert not chunks[-1].choices and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= 1
    assert len({c.id for c in chunks}) == 1


def test_max_completion_tokens_and_stop(server: ServerProcess, llm: LLM) -> None:
    c = client(server)
    short = c.chat.completions.create(model="m", messages=QUESTION, max_completion_tokens=3, temperature=0)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None and short.usage.completion_tokens == 3
    full = llm.chat_completion(QUESTION, max_new_tokens=24, temperature=0)
    cut = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=24, temperature=0, stop=["Paris"])
    assert cut.choices[0].message.content == full[: full.index("Paris")]
    assert cut.choices[0].finish_reason == "stop"


def test_logit_bias_and_penalties_give_the_models_answer_under_them(server: ServerProcess, llm: LLM) -> None:
    c = client(server)
    plain = llm.chat_completion(QUESTION, max_new_tokens=24, temperature=0)
    banned = {llm.encode(" Paris")[0]: -100, llm.encode("Paris")[0]: -100}
    reply = c.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=24, temperature=0, logit_bias={str(k): v for k, v in banned.items()}
    )
    want = llm.chat_completion(QUESTION, max_new_tokens=24, temperature=0, logit_bias=banned)
    assert reply.choices[0].message.content == want and want != plain
    counting = [{"role": "user", "content": "List the numbers from one to twenty, separated by commas."}]
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    reply = c.chat.completions.create(model="m", messages=counting, max_tokens=32, temperature=0, **penalties)
    assert reply.choices[0].message.content == llm.chat_completion(
        counting, max_new_tokens=32, temperature=0, **penalties
    )
    greedy = c.chat.completions.create(model="m", messages=QUESTION, max_tokens=24, temperature=0.7, top_p=0)
    assert greedy.choices[0].message.content == plain  # top_p 0: only the most likely token
    for bias, message in [({"Paris": 5}, "are token ids"), ({"4000000": 5}, "outside this model's vocabulary")]:
        with pytest.raises(openai.BadRequestError, match=message):
            c.chat.completions.create(model="m", messages=QUESTION, max_tokens=4, logit_bias=bias)  # type: ignore[arg-type]


def test_seeded_sampling_repeats_and_differs_by_seed(server: ServerProcess) -> None:
    c = client(server)
    messages = [{"role": "user", "content": "Write a sentence about the sea."}]

    def run(seed: int) -> str:
        reply = c.chat.completions.create(
            model="m", messages=messages, max_tokens=24, temperature=1.0, top_p=0.95, seed=seed
        )
        return reply.choices[0].message.content or ""

    first = run(11)
    assert run(11) == first
    assert len({first, run(12), run(13)}) > 1


def test_logprobs_match_the_models_distribution(server: ServerProcess, llm: LLM) -> None:
    # a question no other test sends: its prompt is prefilled as a whole, as below (a prompt seen
    # before runs its last token as a decode step, whose int8 activations shift logprobs by ~0.05)
    question = [{"role": "user", "content": "Which planet is known as the red planet?"}]
    reply = client(server).chat.completions.create(
        model="m", messages=question, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and len(logprobs.content) == 4
    prompt = llm.encode(llm.apply_chat_template(question))
    cache = llm.model.new_cache(len(prompt) + 8)
    logits = llm.model.forward(torch.tensor(prompt), cache, last_only=True)[-1]
    want = torch.log_softmax(logits.float(), dim=-1)
    first = logprobs.content[0]
    assert first.logprob == pytest.approx(float(want.max()), abs=1e-3)
    assert [t.logprob for t in first.top_logprobs] == pytest.approx(torch.topk(want, 3).values.tolist(), abs=1e-3)
    assert first.top_logprobs[0].token == first.token  # greedy: the sampled token is the best one
    for entry in logprobs.content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1.0 + 1e-4
    assert "".join(t.token for t in logprobs.content) == reply.choices[0].message.content


def test_text_completion_continues_the_prompt(server: ServerProcess, llm: LLM) -> None:
    prompt = "The capital of France is"
    reply = client(server).completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0)
    assert reply.choices[0].text == llm.generate(prompt, 12, temperature=0)
    echoed = client(server).completions.create(
        model="m", prompt=prompt, max_tokens=12, temperature=0, echo=True, logprobs=2
    )
    assert echoed.choices[0].text == prompt + reply.choices[0].text
    lp = echoed.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None
    assert len(lp.tokens) == echoed.usage.completion_tokens  # type: ignore[union-attr]
    assert lp.text_offset[0] == len(prompt)
    streamed = client(server).completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == reply.choices[0].text


def test_a_list_of_prompts_answers_a_choice_each_in_order(server: ServerProcess, llm: LLM) -> None:
    """As clients that batch prompts (LangChain's completion models) send them: one request, a choice per
    prompt, each the answer that prompt gets alone; token-id prompts too; usage summed over the choices."""
    prompts = ["The capital of France is", "Water boils at", "One, two, three,"]
    reply = client(server).completions.create(model="m", prompt=prompts, max_tokens=10, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == [llm.generate(p, 10, temperature=0) for p in prompts]
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == sum(len(llm.prompt_ids(p)) for p in prompts)
    assert reply.usage.completion_tokens == sum(len(llm.encode(c.text)) for c in reply.choices)
    ids = [llm.prompt_ids(p) for p in prompts[:2]]
    by_ids = client(server).completions.create(model="m", prompt=ids, max_tokens=10, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in reply.choices[:2]]
    with pytest.raises(openai.BadRequestError, match="a stream takes one prompt"):
        client(server).completions.create(model="m", prompt=prompts, max_tokens=4, stream=True)
    with pytest.raises(openai.BadRequestError, match="prompts in one request"):
        client(server).completions.create(model="m", prompt=["x"] * 65, max_tokens=4)


def test_json_schema_output_parses_and_validates(server: ServerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
            "population_millions": {"type": "number"},
            "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3},
        },
        "required": ["city", "country", "population_millions", "landmarks"],
        "additionalProperties": False,
    }
    reply = client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        max_tokens=200,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
    )
    value = json.loads(reply.choices[0].message.content or "")
    assert set(value) == set(schema["properties"])
    assert isinstance(value["city"], str) and isinstance(value["country"], str)
    assert isinstance(value["population_millions"], (int, float))
    assert isinstance(value["landmarks"], list) and len(value["landmarks"]) <= 3
    assert all(isinstance(x, str) for x in value["landmarks"])
    assert reply.choices[0].finish_reason == "stop"


def test_json_object_mode(server: ServerProcess) -> None:
    reply = client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Give me a JSON object about a cat."}],
        max_tokens=400,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_required(server: ServerProcess, stream: bool) -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    c = client(server)
    kwargs = {"model": "m", "messages": messages, "tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0}
    if stream:
        chunks = list(c.chat.completions.create(max_tokens=120, stream=True, **kwargs))  # type: ignore[call-overload]
        calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert finish == ["tool_calls"]
        name, arguments = calls[0].function.name, calls[0].function.arguments
    else:
        reply = c.chat.completions.create(max_tokens=120, **kwargs)  # type: ignore[call-overload]
        assert reply.choices[0].finish_reason == "tool_calls"
        assert reply.choices[0].message.content is None
        call = reply.choices[0].message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        name, arguments = call.function.name, call.function.arguments
    assert name in ("get_weather", "get_time")
    args = json.loads(arguments)
    if name == "get_weather":
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    else:
        assert isinstance(args["city"], str)


# as tools are usually declared: nothing said of keys beyond the parameters
OPEN_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_tool_calls_keep_to_the_declared_parameters_and_one_call(server: ServerProcess, choice: str) -> None:
    # schemas are read as llama-server reads them: an object's keys are its properties, and one call
    # per answer unless parallel_tool_calls asks for more (left free, the small model invents keys
    # and repeats its call until max_tokens)
    reply = client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[OPEN_WEATHER],  # type: ignore[list-item]
        tool_choice=choice,  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_json_schema_answers_keep_to_the_declared_properties(server: ServerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"fact": {"type": "string", "maxLength": 40}},
                    "required": ["fact"],
                },
                "maxItems": 2,
            },
        },
        "required": ["city", "facts"],
    }
    reply = client(server).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Tell me about Paris."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        max_tokens=120,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    answer = json.loads(reply.choices[0].message.content or "")
    assert set(answer) == {"city", "facts"}
    assert all(set(item) == {"fact"} for item in answer["facts"])


def test_a_schema_that_cannot_be_generated_is_an_error_and_the_server_goes_on(server: ServerProcess) -> None:
    # an object that must hold itself: every answer would be infinite, and the grammar gives up past
    # its limits at the first tokens; that request gets a 400, the next one its answer
    endless = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="the output grammar cannot go on"):
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "endless", "schema": endless}},
            max_tokens=20,
        )
    reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert reply.choices[0].message.content


def test_named_tool_choice_and_the_result_turn(server: ServerProcess) -> None:
    c = client(server)
    messages: list[dict[str, object]] = [{"role": "user", "content": "What time is it in Tokyo?"}]
    reply = c.chat.completions.create(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=300,
        temperature=0,
    )
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_time"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    # the call and its result go back; the model then answers in words or calls again
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "10:42"})
    follow = c.chat.completions.create(
        model="m",
        messages=messages,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        max_tokens=80,
        temperature=0,
    )
    message = follow.choices[0].message
    assert (message.content or "").strip() or message.tool_calls
    assert follow.choices[0].finish_reason in ("stop", "tool_calls", "length")


def test_a_base_url_without_v1_works_as_with_it(server: ServerProcess, llm: LLM) -> None:
    """llama-server answers its OpenAI routes without the ``/v1`` prefix too; clients configured that
    way get the same answers."""
    bare = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    assert [m.id for m in bare.models.list().data] == ["SmolLM2-135M-Instruct"]
    reply = bare.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == llm.chat_completion(QUESTION, max_new_tokens=12, temperature=0)
    text = bare.completions.create(model="m", prompt="The capital of France is", max_tokens=6, temperature=0)
    versioned = client(server).completions.create(
        model="m", prompt="The capital of France is", max_tokens=6, temperature=0
    )
    assert text.choices[0].text == versioned.choices[0].text
    vector = bare.embeddings.create(model="m", input="The cat sat on the mat.").data[0].embedding
    assert vector == client(server).embeddings.create(model="m", input="The cat sat on the mat.").data[0].embedding


def test_embeddings_are_pooled_hidden_states(server: ServerProcess, llm: LLM) -> None:
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    reply = client(server).embeddings.create(model="m", input=texts)
    assert [d.index for d in reply.data] == [0, 1]
    for text, item in zip(texts, reply.data, strict=True):
        got = torch.tensor(item.embedding)
        assert got.shape == (llm.config.hidden_size,)
        ids = llm.encode(text)
        hidden = llm.model.hidden_states(torch.tensor(ids)).mean(0)
        torch.testing.assert_close(got, hidden / hidden.norm(), atol=1e-5, rtol=1e-4)
    assert reply.usage.prompt_tokens == sum(len(llm.encode(t)) for t in texts)
    b64 = client(server).embeddings.create(model="m", input=texts[0], encoding_format="base64")
    raw = base64.b64decode(b64.data[0].embedding)  # type: ignore[arg-type]
    assert np.frombuffer(raw, dtype=np.float32).tolist() == pytest.approx(reply.data[0].embedding, abs=1e-6)


def test_embeddings_agree_with_transformers_hidden_states(server: ServerProcess, llm: LLM) -> None:
    """The pooled states are the model's own: transformers' last hidden state of the same text."""
    transformers = pytest.importorskip("transformers")
    from torchburn_llm import default_model_path

    path = default_model_path()
    ref = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, torch_dtype=torch.float32)
    text = "A quick brown fox jumps over the lazy dog."
    ids = llm.encode(text)
    with torch.no_grad():
        hidden = ref(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].mean(0)
    want = hidden / hidden.norm()
    got = torch.tensor(client(server).embeddings.create(model="m", input=text).data[0].embedding)
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.995


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 3.0}, "temperature"),
        ({"n": 2}, "n"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server: ServerProcess, kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(model="m", messages=QUESTION, **kwargs)  # type: ignore[call-overload]
    body = info.value.body
    assert isinstance(body, dict) and body.get("param", "").startswith(param)
    assert "Traceback" not in str(body)


def test_prompt_longer_than_the_context_is_400(server: ServerProcess, llm: LLM) -> None:
    long = "word " * (llm.config.max_position + 50)
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(model="m", messages=[{"role": "user", "content": long}], max_tokens=4)
    assert info.value.code == "context_length_exceeded"


def test_unauthorized_call_is_401(start_server) -> None:  # type: ignore[no-untyped-def]
    guarded = start_server("--api-key", "s3cret")
    with pytest.raises(openai.AuthenticationError):
        client(guarded, "wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        client(guarded, "wrong").chat.completions.create(model="m", messages=QUESTION, max_tokens=2)
    assert client(guarded, "s3cret").models.list().data[0].id == "SmolLM2-135M-Instruct"
    reply = client(guarded, "s3cret").chat.completions.create(model="m", messages=QUESTION, max_tokens=2)
    assert reply.usage is not None and reply.usage.completion_tokens == 2
