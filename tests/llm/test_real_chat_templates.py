"""The chat templates of real models, rendered in the sandbox as ``transformers`` renders them (which is
how the models saw their prompts in training): every template llama.cpp keeps for its own tests
(Llama 3.x, Qwen 2.5/3, Mistral, Gemma, Phi-3.5, DeepSeek, Granite, Hermes, gpt-oss and more), over
plain chats, tool definitions and a tool call with its result.

``nox -s tests`` fetches the templates with the rest of llama.cpp's sources (the pinned
llama-cpp-python's) and names their folder in ``TORCHBURN_LLAMA_CPP_SOURCES``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2
import pytest

from torchburn_llm import chat_template

render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

SOURCES_ENV = "TORCHBURN_LLAMA_CPP_SOURCES"
# text that JSON and HTML escape differently, and text outside ASCII
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city — it's <b> & 'quoted', café",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}},
                "required": ["city"],
            },
        },
    }
]
# nine letters and digits: what Mistral's templates take (the server maps other ids to such)
CALL = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CHATS: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "system and user": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi, café?"}], {}),
    "turns": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
        ],
        {},
    ),
    "tools": (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
        {"tools": TOOLS},
    ),
    "tool call and result": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": CALL["id"], "name": "get_weather", "content": "sunny"},
        ],
        {"tools": TOOLS},
    ),
}
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def _templates() -> list[Path]:
    folder = os.environ.get(SOURCES_ENV)
    assert folder, f"{SOURCES_ENV} names a folder of llama.cpp's sources; nox -s tests fetches it"
    found = sorted((Path(folder) / "models" / "templates").glob("*.jinja"))
    assert len(found) >= 40, f"expected llama.cpp's collection of model templates in {folder}/models/templates"
    return found


def _reference(template: str, messages: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True, **extra, **SPECIAL
    )
    return str(rendered[0])


def test_real_templates_render_as_transformers_renders_them() -> None:
    compared = refused = merged = 0
    for path in _templates():
        template = path.read_text(encoding="utf-8")
        for chat, (messages, extra) in CHATS.items():
            where = f"{path.name}, {chat}"
            try:
                want = _reference(template, messages, extra)
            except jinja2.TemplateError:
                # refused by the template (or it needs variables of its own): so it is here, unless all
                # it refused is the system message, which then goes at the head of the first user turn
                with_system_merged = chat_template._system_in_first_user_turn(messages)
                try:
                    got = chat_template.render(template, messages, True, **extra, **SPECIAL)
                except ValueError:
                    refused += 1
                    continue
                assert with_system_merged is not None, f"{where}: rendered what transformers refuses"
                assert got == _reference(template, with_system_merged, extra), where
                merged += 1
                continue
            except TypeError:
                continue  # a tool-use template given no tools: transformers passes None and fails on it
            assert chat_template.render(template, messages, True, **extra, **SPECIAL) == want, where
            compared += 1
    assert compared >= 200 and refused >= 5 and merged >= 1, (compared, refused, merged)
