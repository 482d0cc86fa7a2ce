"""Chat templates (Jinja2, as the tokenizer files ship them) rendered in a sandbox: a template can
format messages but not reach Python objects, files or the network."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ModelLoadError


def from_folder(folder: Path) -> str | None:
    """``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a string, or the
    one named "default" in a list of named templates)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelLoadError(f"{config} is not valid JSON: {exc}") from exc
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def render(template: str, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True, **extra: Any) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', got {m!r}")

    def raise_exception(message: str) -> None:
        raise ValueError(f"the chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **extra
        )
    except TemplateError as exc:
        raise ValueError(f"the chat template failed: {exc}") from exc
