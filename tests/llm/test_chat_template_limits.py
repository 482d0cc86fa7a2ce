"""A model's chat template is untrusted code: it renders under limits on time, size and depth, and one that
loops forever, builds a huge string or recurses is a one-line ChatTemplateError naming the limit it hit —
stopped before the work is done, not after.

The hostile templates render in a forked child with 1 GiB more address space than the test process has
and a 60 s alarm, so that without the limits a test fails instead of exhausting the machine.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import time
import tracemalloc
from pathlib import Path

import pytest

from torchburn_llm import ModelLoadError
from torchburn_llm.chat_template import render
from torchburn_llm.errors import ChatTemplateError

HI = [{"role": "user", "content": "hi"}]


def _render_in_child(template: str) -> tuple[str, str, float]:
    """(exception type or "ok", message or output length, seconds) of rendering ``template`` in a child."""
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork to keep a hostile template's work out of the test process")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: limits first, then the render, then its outcome down the pipe
        try:
            os.close(read)
            signal.alarm(60)
            status = Path("/proc/self/status")
            if status.exists():
                size = next(int(line.split()[1]) * 1024 for line in status.open() if line.startswith("VmSize:"))
                resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
            start = time.monotonic()
            try:
                outcome = ["ok", str(len(render(template, HI)))]
            except BaseException as exc:
                outcome = [type(exc).__name__, str(exc)]
            os.write(write, json.dumps([*outcome, time.monotonic() - start]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return "died", f"the child ended with {os.waitstatus_to_exitcode(status)} and no outcome", 0.0
    kind, message, seconds = json.loads(data)
    return kind, message, seconds


NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
SELF_CONTAINING = "{% set ns = namespace() %}{% set ns.c = [ns] %}"


@pytest.mark.parametrize(
    ("template", "limit"),
    [
        # loops that never end in practice
        (NESTED, "step|time"),
        ("{% set r = range(100000)|list %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", "step|time"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "output|step|time"),
        ("{{ ([[1]] * 100000)|sum(start=[])|length }}", "size|step|time"),
        ("{% for i in range(10**9) %}{% endfor %}", "range"),
        ("{{ lipsum(10**9) }}", "undefined"),  # no placeholder text of any length
        # strings and lists of gigabytes
        ("{{ 'a' * 10**10 }}", "size"),
        ("{{ ['a'] * 10**10 }}", "size"),
        ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "size"),
        ("{% set ns = namespace(s=['x']) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "size"),
        ("{{ '%10000000000s' % 'a' }}", "size"),
        ("{{ '%s%s' % ('x' * 3000000, 'y' * 3000000) }}", "size"),
        ("{{ '{:>10000000000}'.format(1) }}", "size"),
        ("{{ '{:{}}'.format(1, 10**10) }}", "size"),
        ("{{ ('x' * 1000000).join(['a'] * 10000) }}", "size"),
        ("{{ (['x' * 1000000] * 10000)|join }}", "size"),
        ("{{ ['x' * 1000000] * 10000 }}", "size"),  # printed as a list
        ("{{ 'x'|center(10**10) }}", "size"),
        ("{{ 'x'.ljust(10**10) }}", "size"),
        ("{{ 'x'|indent(10**9) }}", "size"),
        ("{{ ('x ' * 100000)|wordwrap(1, wrapstring='y' * 100000) }}", "size"),
        ("{{ ('a' * 1000)|replace('', 'x' * 1000000) }}", "size"),
        ("{{ ('\t' * 1000).expandtabs(10**7) }}", "size"),
        ("{{ ('a' * 1000).translate({97: 'x' * 10**7}) }}", "size"),
        ("{{ (1).to_bytes(10**10, 'big') }}", "size"),
        ("{{ [1]|batch(10**10, 'x')|list }}", "size"),
        ("{{ range(10)|slice(10**10)|list }}", "size"),
        (
            "{% set x = 'x' * 1000000 %}{% macro m() %}{% for i in range(10000) %}{{ x }}{% endfor %}{% endmacro %}"
            "{{ m() }}",
            "size",
        ),
        # integers whose arithmetic would take hours
        ("{{ 2 ** 100000000 }}", "number"),
        ("{% set n = namespace(x=3) %}{% for i in range(40) %}{% set n.x = n.x * n.x %}{% endfor %}", "number"),
        # recursion
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "depth"),
        (SELF_CONTAINING + "{% for n in ns.c recursive %}{{ loop(n.c) }}{% endfor %}", "depth"),
        ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "depth"),
        (
            "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
            "depth",
        ),
    ],
)
def test_a_hostile_template_hits_a_named_limit(template: str, limit: str) -> None:
    kind, message, seconds = _render_in_child(template)
    assert kind == "ChatTemplateError", f"{kind}: {message}"
    assert "\n" not in message
    if limit == "undefined":
        assert message == "the chat template failed: 'lipsum' is undefined"
    else:
        assert any(f"hit its {word} limit" in message for word in limit.split("|")), message
    assert seconds < 15  # a 2 s deadline, on a loaded machine


def test_a_huge_string_is_refused_before_it_is_built() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError, match=r"size limit: a str repeated 100,000,000 times would hold"):
            render("{{ 'a' * 10**8 }}", HI)
        with pytest.raises(ChatTemplateError, match=r"size limit: the result of \|center would hold"):
            render("{{ 'x'|center(10**8) }}", HI)
        with pytest.raises(ChatTemplateError, match=r"size limit: a macro's or block's output would hold"):
            render("{% set x %}{% for i in range(10) %}{{ 'y' * 1000000 }}{% endfor %}{% endset %}", HI)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20  # the 100 MB strings were never allocated


def test_the_deadline_stops_slow_steps() -> None:
    # few steps, each slow: only the clock can stop it (100k upper-casings of 3 MB: minutes)
    template = "{% set big = 'x' * 3000000 %}{% for i in range(100000) %}{% set y = big.upper() %}{% endfor %}"
    kind, message, seconds = _render_in_child(template)
    assert kind == "ChatTemplateError", message
    assert message == "the chat template hit its time limit: rendering took longer than 2 s (an endless loop?)"
    assert 2 <= seconds < 15


def test_a_failing_template_is_a_chat_template_error() -> None:
    for template, message in [
        ("{{ 1 / 0 }}", "the chat template failed: division by zero"),
        ("{% for %}", "the chat template failed: Expected an expression, got 'end of statement block'"),
        ("{{ messages.x.y() }}", "the chat template failed: 'list object' has no attribute 'x'"),
        ("{{ (1).__class__.__subclasses__() }}", "the chat template failed: access to attribute '__class__'"),
        ("x" * (2 << 20), "the chat template hit its length limit: it is 2,097,152 characters long"),
    ]:
        with pytest.raises(ChatTemplateError) as caught:
            render(template, HI)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
        assert isinstance(caught.value, ModelLoadError) and isinstance(caught.value, ValueError)
    # the template refusing the messages is the request's fault, as before
    with pytest.raises(ValueError, match="the chat template refused the messages: roles must alternate") as refused:
        render("{{ raise_exception('roles must alternate') }}", HI)
    assert not isinstance(refused.value, ChatTemplateError)


QWEN = """{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}
{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}
{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

LLAMA = """{{- bos_token }}{%- set ns = namespace(system='') %}{%- for m in messages if m.role == 'system' %}
{%- set ns.system = ns.system ~ m.content | trim %}{%- endfor %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' ~ ns.system ~ '<|eot_id|>' }}
{%- for m in messages if m.role != 'system' %}
{{- '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' ~ m.content | trim ~ '<|eot_id|>' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""


def test_the_limits_leave_room_for_long_chats_and_real_templates() -> None:
    # 2000 turns of 2500 characters: a 5 MB prompt, past the 4 MiB base limit, allowed by the room the
    # messages themselves make
    turns = [{"role": ("user", "assistant")[i % 2], "content": f"{i} " + "w" * 2500} for i in range(2000)]
    for template in (QWEN, LLAMA):
        start = time.monotonic()
        out = render(template, [{"role": "system", "content": "Be brief."}, *turns], bos_token="<s>")
        assert len(out) > 5_000_000 and out.count("w" * 2500) == 2000
        assert time.monotonic() - start < 2
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert '{"type": "function", "function": {"name": "get_weather"' in render(QWEN, HI, tools=tools)
    # and the same room is all there is: a template that repeats the conversation twentyfold is refused
    echo = "{% for i in range(20) %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="hit its output limit: it writes more than"):
        render(echo, turns)


# the dated system prompt of Llama 3.1-style templates, as their files write it
DATED = (
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}'
    "{%- endif %}{%- endif %}"
    "Today Date: {{ date_string }}\n{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
)


def test_templates_date_their_prompt_as_transformers_does() -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": "hi"}]
    want, _ = render_jinja_template(conversations=[messages], chat_template=DATED)
    assert render(DATED, messages) == want[0]
    assert time.strftime("%d %b %Y") in want[0]
    with pytest.raises(ChatTemplateError, match="at most 64 characters"):
        render('{{ strftime_now("%Y" * 100) }}', messages)
