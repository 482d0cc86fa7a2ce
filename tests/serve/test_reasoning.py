"""A reasoning model's thinking apart from its answer (``reasoning_content``), as llama-server returns it:
the splitter on hand-made answers, streamed piece by piece as well as whole; then a server on a tiny model
whose template opens a thinking block (as DeepSeek-R1's does) unless ``chat_template_kwargs`` turns it
off (as Qwen3's ``enable_thinking`` does), against the same model and template run in this process."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
import torch

from serve_process import ServerProcess
from torchburn_llm import LLM
from torchburn_serve import reasoning

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("text", "inside", "want"),
    [
        ("<think>\nLet me see.\n</think>\n\nParis.", False, ("\nLet me see.\n", "Paris.")),
        ("  <think>a</think>b", False, ("a", "b")),
        ("Let me see.\n</think>\n\nParis.", True, ("Let me see.\n", "Paris.")),
        ("Paris.", False, ("", "Paris.")),
        ("<b>Paris</b>", False, ("", "<b>Paris</b>")),
        ("<think>cut short while thin", False, ("cut short while thin", "")),
        ("cut short </thi", True, ("cut short </thi", "")),
        ("<think>a</think>\n\n", False, ("a", "")),
        ("  ", False, ("", "  ")),
        ("", True, ("", "")),
    ],
)
def test_split_whole_and_streamed(text: str, inside: bool, want: tuple[str, str]) -> None:
    assert reasoning.split(text, inside) == want
    for step in (1, 2, 3):  # tags cut anywhere between pieces
        splitter = reasoning.ReasoningSplitter(inside)
        pieces = [splitter.push(text[i : i + step]) for i in range(0, len(text), step)] + [splitter.finish()]
        assert ("".join(r for r, _ in pieces), "".join(c for _, c in pieces)) == want


# ChatML, with the assistant's turn opened inside a thinking block unless enable_thinking is false
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if not (enable_thinking is defined and enable_thinking is false) %}<think>\n{% endif %}{% endif %}"
)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory: pytest.TempPathFactory, smollm2_file: Path) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer and the thinking template."""
    folder = tmp_path_factory.mktemp("thinking")
    tok = transformers.AutoTokenizer.from_pretrained(str(smollm2_file.parent), gguf_file=smollm2_file.name)
    tok.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    (folder / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def smollm2_file() -> Path:
    from torchburn_llm import default_model_path

    return default_model_path()


def _answer(llm: LLM, **template_variables: object) -> str:
    prompt = llm.apply_chat_template(QUESTION, True, **template_variables)
    ids = llm.generate_ids(llm.prompt_ids(prompt), 12)
    return str(llm.tokenizer.decode(ids, skip_special_tokens=True))


def test_thinking_goes_to_reasoning_content(start_server: object, thinking_model: Path) -> None:
    server: ServerProcess = start_server("--model", str(thinking_model))  # type: ignore[operator]
    llm = LLM.from_pretrained(thinking_model)
    url = server.url + "/v1/chat/completions"
    body = {"messages": QUESTION, "max_tokens": 12, "temperature": 0}
    for extra, inside in (({}, True), ({"chat_template_kwargs": {"enable_thinking": False}}, False)):
        text = _answer(llm, **extra.get("chat_template_kwargs", {}))  # type: ignore[arg-type]
        thought, content = reasoning.split(text, inside)
        assert bool(thought) == inside  # the random model never closes the block: all of it is thinking
        whole = httpx.post(url, json={**body, **extra}, timeout=60).json()["choices"][0]["message"]
        assert whole["content"] == content and whole.get("reasoning_content", "") == thought
        streamed = httpx.post(url, json={**body, **extra, "stream": True}, timeout=60).text
        deltas = [json.loads(line[6:])["choices"] for line in streamed.splitlines() if line.startswith("data: {")]
        pieces = [c[0]["delta"] for c in deltas if c]
        assert "".join(p.get("content") or "" for p in pieces) == content
        assert "".join(p.get("reasoning_content") or "" for p in pieces) == thought
    assert thought == "" and text  # with thinking off, the answer is all content
    # reasoning_format "none": the raw text, as it came
    raw = httpx.post(url, json={**body, "reasoning_format": "none"}, timeout=60).json()["choices"][0]["message"]
    assert raw["content"] == _answer(llm) and "reasoning_content" not in raw
    bad = httpx.post(url, json={**body, "chat_template_kwargs": {"messages": []}}, timeout=60)
    assert bad.status_code == 400 and "set by the server" in bad.json()["error"]["message"]


def test_ollama_chat_returns_thinking_apart(start_server: object, thinking_model: Path) -> None:
    server: ServerProcess = start_server("--model", str(thinking_model))  # type: ignore[operator]
    llm = LLM.from_pretrained(thinking_model)
    client = ollama.Client(host=server.url)
    options = {"temperature": 0, "num_predict": 12}
    thought, content = reasoning.split(_answer(llm), True)
    whole = client.chat(model="m", messages=QUESTION, options=options).message
    assert (whole.thinking, whole.content) == (thought, content) and thought
    parts = list(client.chat(model="m", messages=QUESTION, options=options, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == thought
    assert "".join(p.message.content or "" for p in parts) == content
    # think=False: the template is asked not to think, and the answer is all content
    off = client.chat(model="m", messages=QUESTION, options=options, think=False).message
    assert off.content == _answer(llm, enable_thinking=False) and not off.thinking


def test_anthropic_messages_return_thinking_blocks(start_server: object, thinking_model: Path) -> None:
    server: ServerProcess = start_server("--model", str(thinking_model))  # type: ignore[operator]
    llm = LLM.from_pretrained(thinking_model)
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    # greedy: the client sends temperature in the body, as older clients did
    request = {"model": "m", "max_tokens": 12, "extra_body": {"temperature": 0}, "messages": QUESTION}
    thought, content = reasoning.split(_answer(llm), True)
    assert thought and not content  # the random model never closes the block
    whole = client.messages.create(**request)  # type: ignore[call-overload]
    assert [(b.type, b.thinking) for b in whole.content] == [("thinking", thought)]
    with client.messages.stream(**request) as stream:
        events = list(stream)
    assert "".join(e.delta.thinking for e in events if e.type == "content_block_delta") == thought  # type: ignore[union-attr]
    assert stream.get_final_message().content == whole.content
    # thinking disabled: the template is asked not to think, and the answer is all text
    off = client.messages.create(**request, thinking={"type": "disabled"})  # type: ignore[call-overload]
    assert [(b.type, b.text) for b in off.content] == [("text", _answer(llm, enable_thinking=False))]


def test_responses_api_returns_a_reasoning_item(start_server: object, thinking_model: Path) -> None:
    server: ServerProcess = start_server("--model", str(thinking_model))  # type: ignore[operator]
    llm = LLM.from_pretrained(thinking_model)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    request = {"model": "m", "input": QUESTION[0]["content"], "max_output_tokens": 12, "temperature": 0}
    thought, content = reasoning.split(_answer(llm), True)
    whole = client.responses.create(**request)  # type: ignore[call-overload]
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    assert whole.output[0].content[0].text == thought and whole.output_text == content  # type: ignore[union-attr]
    events = list(client.responses.create(**request, stream=True))  # type: ignore[call-overload]
    final = events[-1].response  # cut off while thinking: "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought  # type: ignore[union-attr]
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]  # type: ignore[union-attr]
    assert final.output[0].content[0].text == thought and final.output_text == content  # type: ignore[union-attr]
    # reasoning effort "none": the template is asked not to think, and the answer is all text
    off = client.responses.create(**request, reasoning={"effort": "none"})  # type: ignore[call-overload]
    assert [item.type for item in off.output] == ["message"]
    assert off.output_text == _answer(llm, enable_thinking=False)
    # the output sent back as input, as the client's docs say to: its reasoning item is left out
    turns = [{"role": "user", "content": "Hi"}, *whole.output, {"role": "user", "content": "And Italy?"}]
    follow = client.responses.create(**{**request, "input": turns})  # type: ignore[call-overload]
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": content},
             {"role": "user", "content": "And Italy?"}]  # fmt: skip
    again = client.responses.create(**{**request, "input": plain})  # type: ignore[call-overload]
    assert (
        follow.output_text == again.output_text and follow.output[0].content[0].text == again.output[0].content[0].text
    )  # type: ignore[union-attr]
