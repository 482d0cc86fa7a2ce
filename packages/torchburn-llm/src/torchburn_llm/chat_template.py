"""Chat templates (Jinja2, as the tokenizer files ship them) rendered in a sandbox: a template can
format messages but not reach Python objects, files or the network, and it renders under limits on
time, size and depth (see :mod:`template_sandbox`): one that loops forever, builds a huge string or
recurses is a :class:`ChatTemplateError` naming the limit."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import files
from .errors import ChatTemplateError
from .template_sandbox import BoundedEnvironment, GenerationBlocks, TemplateLimits


class _Refusal(ValueError):
    """The template's own ``raise_exception``: it refuses the messages (a request error, not a bad model)."""


def from_folder(folder: Path, name: str = "default") -> str | None:
    """``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a string, or the
    one named "default" in a list of named templates). Another ``name`` (``tool_use``: the template for
    requests with tools) is read from ``additional_chat_templates/NAME.jinja`` or that list."""
    if name == "default":
        jinja = folder / "chat_template.jinja"
    elif _TEMPLATE_NAME.fullmatch(name):
        jinja = folder / "additional_chat_templates" / f"{name}.jinja"
    else:
        raise ValueError(f"a chat template name is letters, digits and '_', not {name!r}")
    if files.present(jinja):
        return files.read_text(jinja, folder, files.MAX_TEMPLATE_BYTES)
    config = folder / "tokenizer_config.json"
    if not files.present(config):
        return None
    template = files.read_json_object(config, folder).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get(name)
    elif name != "default":
        return None
    return template if isinstance(template, str) else None


_TEMPLATE_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def _strftime_now(fmt: str) -> str:
    """Today's date in ``fmt`` (``strftime``'s codes): Llama 3.1+ templates date their system prompt
    with it, as transformers and llama.cpp let them."""
    if not isinstance(fmt, str) or len(fmt) > 64:
        raise ValueError("strftime_now takes a format of at most 64 characters")
    return datetime.datetime.now().strftime(fmt)


def render(
    template: str,
    messages: Sequence[dict[str, str]],
    add_generation_prompt: bool = True,
    limits: TemplateLimits | None = None,
    **extra: Any,
) -> str:
    """The prompt ``template`` makes of ``messages``, rendered under ``limits`` (the defaults, with room
    for the messages' length). A template that refuses a system message (Gemma's: "System role not
    supported") gets it at the head of the first user message instead, as llama-server and ollama give
    it; where that is refused too, the first refusal stands."""
    try:
        return _render(template, messages, add_generation_prompt, limits, **extra)
    except _Refusal as refusal:
        merged = _system_in_first_user_turn(messages)
        if merged is None:
            raise
        try:
            return _render(template, merged, add_generation_prompt, limits, **extra)
        except _Refusal:
            raise refusal from None


def _system_in_first_user_turn(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``messages`` with a leading system message's text put before the first user message's, or None
    where they do not start with a system message and a user one."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return None
    system, user = messages[0], messages[1]
    return [{**user, "content": f"{system['content']}\n\n{user['content']}"}, *messages[2:]]


def _render(
    template: str,
    messages: Sequence[dict[str, str]],
    add_generation_prompt: bool,
    limits: TemplateLimits | None,
    **extra: Any,
) -> str:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', got {m!r}")
    given = sum(len(m["role"]) + len(m["content"]) for m in messages)
    # further variables (a tool list) are part of the input too: the output may quote them
    given += sum(len(v) if isinstance(v, str) else len(json.dumps(v, default=str)) for v in extra.values())
    limits = (limits or TemplateLimits()).for_input(given)
    if len(template) > limits.source:
        raise ChatTemplateError(
            f"the chat template hit its length limit: it is {len(template):,} characters long "
            f"(at most {limits.source:,})"
        )

    def raise_exception(message: str) -> None:
        raise _Refusal(f"the chat template refused the messages: {message}")

    extensions = ["jinja2.ext.loopcontrols", GenerationBlocks]  # what transformers renders templates with
    env = BoundedEnvironment(limits, trim_blocks=True, lstrip_blocks=True, extensions=extensions)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        out: list[str] = []
        written = 0
        compiled = env.from_string(template)
        for piece in compiled.generate(messages=list(messages), add_generation_prompt=add_generation_prompt, **extra):
            written += len(piece)
            if written > limits.chars:
                raise env.fail("output", f"it writes more than {limits.chars:,} characters")
            env.check_time()
            out.append(piece)
        return "".join(out)
    except (ChatTemplateError, _Refusal):
        raise
    except RecursionError:
        raise ChatTemplateError("the chat template hit its depth limit: it nests too deeply to render") from None
    except MemoryError:
        raise ChatTemplateError("the chat template hit its size limit: rendering ran out of memory") from None
    except Exception as exc:  # a template's error (syntax, undefined value, 1/0, ...) is the model's
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise ChatTemplateError(f"the chat template failed: {message}") from exc
