"""What chat templates see and write, against ``transformers``' rendering of the same templates: its
``tojson`` (keys in order, text unescaped), ``{% generation %}`` blocks, string methods inside loops,
and a system message for a template that refuses one."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from torchburn_llm.chat_template import render

render_jinja_template = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <there> & 'you', café"}]
TOOLS = [
    {"type": "function", "function": {"name": "f", "description": "x < y & 'z' — é", "parameters": {"b": 1, "a": 2}}}
]


def _reference(template: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True, **extra
    )
    return str(rendered[0])


@pytest.mark.parametrize(
    "template",
    [
        # plain JSON in the tools' own key order, unescaped; and joined with text, which stays as it is
        "{% for t in tools %}{{ t | tojson }}\n{% endfor %}",
        "{{ '<tools>' + (tools | tojson) + '</tools>' }}{{ messages[1].content ~ (tools[0] | tojson) }}",
        "{{ tools | tojson(indent=2) }}{{ tools | tojson(separators=(',', ':'), sort_keys=true) }}",
        "{{ tools | tojson(ensure_ascii=true) }}",
        # training templates mark the assistant's part; rendering keeps the body
        "{% for m in messages %}{% generation %}{{ m.role }}: {{ m.content }}{% endgeneration %}\n{% endfor %}",
        # string methods called where a loop has set variables
        "{% for m in messages %}{% set c = m.content %}{{ c.replace('Hi', 'Hello').strip().split(' ')[0] }}"
        "{% endfor %}",
    ],
)
def test_templates_write_what_transformers_writes(template: str) -> None:
    assert render(template, MESSAGES, tools=TOOLS) == _reference(template, MESSAGES, tools=TOOLS)


# as Gemma's templates do: a system message is refused, and user and assistant turns must alternate
NO_SYSTEM = (
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "<turn>{{ m.role }}\n{{ m.content }}</turn>\n{% endfor %}<turn>model\n"
)


def test_a_system_message_goes_into_the_first_user_turn_where_the_template_refuses_it() -> None:
    with pytest.raises(jinja2.TemplateError, match="System role not supported"):
        _reference(NO_SYSTEM, MESSAGES)
    merged = [{"role": "user", "content": f"{MESSAGES[0]['content']}\n\n{MESSAGES[1]['content']}"}]
    assert render(NO_SYSTEM, MESSAGES) == _reference(NO_SYSTEM, merged)
    # a refusal for anything else stands, the first one reported
    with pytest.raises(ValueError, match="System role not supported"):
        render(NO_SYSTEM, [*MESSAGES, {"role": "user", "content": "again"}])
    with pytest.raises(ValueError, match="roles must alternate"):
        render(NO_SYSTEM, [MESSAGES[1], MESSAGES[1]])
