"""``torchburn.LLM``: a loaded model, its tokenizer and chat template, and the ways to run it."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch

from . import chat_template, files, hub
from .architectures import Architecture
from .checks import MAX_VOCAB, flag, real, token_ids, whole
from .config import ModelConfig
from .default_model import default_model_path
from .errors import ContextLengthError, ModelLoadError
from .gguf_quants import refuse_split
from .hub import looks_like_repo_id
from .linear import QUANTS, STORED
from .loader import Progress, load_folder, load_gguf
from .model import KVCache, Transformer
from .sampling import Sampler, SamplingParams
from .streaming import TextStream
from .tokenizer import begins_with, check_vocabulary
from .tokenizer import from_folder as tokenizer_from_folder

# A reused prefix still reruns the prompt's last this-many tokens (all of a shorter prompt): they then
# take the prompt path's arithmetic (from 8 tokens on, the native prompt kernels) and give the logits a
# fresh prompt gives, bit for bit. Running only the last token takes the decode step's arithmetic
# instead, whose rounding differs; where a model's top two tokens are that close, an answer would
# change with whether its prefix was cached.
PROMPT_TAIL = 8


class Session:
    """A KV cache plus the ids it holds: a new prompt that starts with them (the next turn of a chat,
    the same system prompt) only runs its new tokens."""

    def __init__(self, model: Transformer, capacity: int) -> None:
        self.model = model
        self.cache: KVCache = model.new_cache(capacity)
        self.ids: list[int] = []

    def prefill(self, prompt: Sequence[int]) -> torch.Tensor:
        """Logits [V] after ``prompt``, reusing the cached prefix it shares with the previous one."""
        same = 0
        for a, b in zip(self.ids, prompt, strict=False):
            if a != b:
                break
            same += 1
        same = max(0, min(same, len(prompt) - PROMPT_TAIL))  # see PROMPT_TAIL
        self.cache.reset(same)
        self.ids = list(prompt[:same])
        return self.step(prompt[same:])

    def step(self, ids: Sequence[int]) -> torch.Tensor:
        logits = self.model.forward(torch.tensor(list(ids), dtype=torch.long), self.cache, last_only=True)
        self.ids.extend(ids)
        return logits[-1]


class LLM:
    """A decoder-only language model ready to run on the CPU."""

    def __init__(
        self,
        arch: Architecture,
        cfg: ModelConfig,
        model: Transformer,
        tokenizer: Any = None,
        template: str | None = None,
        defaults: SamplingParams | None = None,
        eos_ids: Sequence[int] = (),
        tool_template: str | None = None,
    ) -> None:
        self.architecture, self.config, self.model = arch, cfg, model
        self.tokenizer, self.chat_template = tokenizer, template
        # the template for requests with tools, where the model ships one apart (Hermes 2 Pro, Command-R)
        self.tool_chat_template = tool_template
        self.defaults = defaults or SamplingParams()
        self.eos_ids = tuple(eos_ids) or cfg.eos_token_ids
        # what the tokenizer puts before a prompt (BOS where the model was trained with one)
        self.prompt_start = begins_with(tokenizer)
        self._session: Session | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        quant: str | None = None,
        device: str = "cpu",
        progress: Progress | None = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
    ) -> LLM:
        """Load a local Hugging Face checkpoint folder, a ``.gguf`` file, or a Hub id such as
        ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` or, for one file of a GGUF repo, ``"org/name-GGUF:Q4_K_M"``
        (from the Hugging Face cache, or downloaded; ``revision`` and ``token`` as huggingface_hub takes
        them); with no path, the embedded SmolLM2-135M-Instruct.
        ``progress(done, total)`` is called as tensors load.

        ``quant``: the weight format. By default a GGUF file runs in its stored types (``"stored"``: read
        in place from the mapped file, as llama.cpp does) and a checkpoint folder in int4, the fastest
        format within the quality gates (fp32 where a matrix's rows are not whole blocks of 32);
        ``"fp32"``, ``"bf16"``, ``"int8"`` or ``"int4"`` convert either."""
        if quant is not None and quant not in (*QUANTS, STORED):
            raise ValueError(f"quant={quant!r} is not available; choose one of {', '.join((*QUANTS, STORED))}")
        if device not in ("cpu", "auto"):
            raise ValueError(f"device={device!r} is not available; the LLM runtime runs on 'cpu' (or 'auto')")
        if path is None:
            path = default_model_path()
        elif not Path(path).exists() and looks_like_repo_id(str(path)):
            path = hub.resolve(str(path), revision=revision, token=token)
        path = Path(path)
        if path.suffix == ".gguf":
            refuse_split(path)
            arch, cfg, model, (tokenizer, template, tool_template) = load_gguf(path, progress, quant or STORED)
            return cls(arch, cfg, model, tokenizer, template, tool_template=tool_template)
        if quant == STORED:
            raise ValueError(
                f"quant='stored' keeps a GGUF file's own types; {path} is a checkpoint folder: choose one of "
                f"{', '.join(QUANTS)}"
            )
        arch, cfg, model = load_folder(path, progress, quant)
        defaults, eos = _generation_config(path, cfg)
        tokenizer = tokenizer_from_folder(path)
        check_vocabulary(tokenizer, cfg.vocab_size, str(path))
        templates = chat_template.from_folder(path), chat_template.from_folder(path, "tool_use")
        return cls(arch, cfg, model, tokenizer, templates[0], defaults, eos, tool_template=templates[1])

    # --- token level --------------------------------------------------------------------------

    def _session_for(self, need: int) -> Session:
        if need > self.config.max_position:
            raise ContextLengthError(
                f"{need} tokens (prompt + new) exceed the model's context of {self.config.max_position}"
            )
        if self._session is None or self._session.cache.capacity < need:
            self._session = Session(self.model, min(self.config.max_position, max(need, 512)))
        return self._session

    @torch.no_grad()
    def generate_tokens(self, prompt: Sequence[int], max_new_tokens: int, params: SamplingParams) -> Iterator[int]:
        """New token ids after ``prompt`` until EOS (not yielded) or ``max_new_tokens``."""
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(prompt) + max_new_tokens > self.config.max_position:
            raise ContextLengthError(
                f"{len(prompt)} prompt tokens + {max_new_tokens} new ones exceed the model's context of "
                f"{self.config.max_position} positions"
            )
        if max_new_tokens == 0:
            return
        session = self._session_for(len(prompt) + max_new_tokens)
        sampler = Sampler(params)
        logits = session.prefill(prompt)
        for i in range(max_new_tokens):
            token = sampler(logits, session.ids)
            if token in self.eos_ids:
                return
            yield token
            if i + 1 < max_new_tokens:
                logits = session.step([token])

    def generate_ids(self, prompt: Sequence[int], max_new_tokens: int = 32) -> list[int]:
        """Greedy continuation of the token ids ``prompt`` (the new ids; EOS ends it, not included)."""
        return list(self.generate_tokens(prompt, max_new_tokens, SamplingParams()))

    # --- text level ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ModelLoadError("this model has no tokenizer (no tokenizer.json): pass token ids instead")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates: undecodable bytes of a command line or file name
            raise ValueError(
                f"the text is not valid Unicode: {exc.reason} at position {exc.start} (undecodable bytes?)"
            ) from None
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt_ids(self, text: str) -> list[int]:
        """``text`` as a prompt: its tokens after the BOS the model expects, unless the text (a
        rendered chat template, say) already starts with it."""
        ids = self.encode(text)
        start = self.prompt_start
        if start and ids[: len(start)] != start:
            ids = start + ids
        return ids

    def stream(
        self,
        prompt: str,
        max_new_tokens: int = 256,
        *,
        stop: Sequence[str] = (),
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        logit_bias: dict[int, float] | None = None,
    ) -> Iterator[str]:
        """Text pieces as they are decoded (whole characters; stop strings cut and never shown)."""
        params = self.defaults.updated(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            logit_bias=None if logit_bias is None else tuple(logit_bias.items()),
        )
        text = TextStream(self.tokenizer, stop)
        for token in self.generate_tokens(self.prompt_ids(prompt), max_new_tokens, params):
            piece = text.push(token)
            if piece:
                yield piece
            if text.stopped:
                return
        rest = text.finish()
        if rest:
            yield rest

    def generate(self, prompt: str, max_new_tokens: int = 256, **options: Any) -> str:
        """The continuation of ``prompt`` as text (options as for :meth:`stream`)."""
        return "".join(self.stream(prompt, max_new_tokens, **options))

    def apply_chat_template(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """The prompt the model's chat template makes of ``messages``; ``extra`` are further template
        variables (``tools=[...]`` for a template that formats tool definitions: the model's template for
        tools where it ships one apart, as transformers picks it)."""
        template = self.tool_chat_template if extra.get("tools") and self.tool_chat_template else self.chat_template
        if template is None:
            raise ModelLoadError("this model ships no chat template; use generate() with a plain prompt")
        tokens = self.tokenizer
        special = {}
        for key, tid in (
            ("bos_token", self.config.bos_token_id),
            ("eos_token", self.eos_ids[0] if self.eos_ids else None),
        ):
            if tid is not None and tokens is not None:
                special[key] = tokens.id_to_token(int(tid))
        return chat_template.render(template, messages, add_generation_prompt, **extra, **special)

    def chat_completion(self, messages: Sequence[dict[str, str]], max_new_tokens: int = 256, **options: Any) -> str:
        """The assistant's reply to ``messages`` (dicts with ``role`` and ``content``)."""
        return self.generate(self.apply_chat_template(messages), max_new_tokens, **options)

    def chat(
        self,
        system_prompt: str | None = None,
        *,
        input_stream: TextIO | None = None,
        output: TextIO | None = None,
        max_new_tokens: int = 512,
        **options: Any,
    ) -> None:
        """Interactive chat in the terminal; the KV cache carries over between turns. /exit or EOF ends it."""
        stdin, stdout = input_stream or sys.stdin, output or sys.stdout
        messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        while True:
            stdout.write(">>> ")
            stdout.flush()
            line = stdin.readline()
            if not line or line.strip() in ("/exit", "/quit"):
                stdout.write("\n")
                return
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line.rstrip("\n")})
            reply = []
            for piece in self.stream(self.apply_chat_template(messages), max_new_tokens, **options):
                stdout.write(piece)
                stdout.flush()
                reply.append(piece)
            stdout.write("\n")
            messages.append({"role": "assistant", "content": "".join(reply)})


def _generation_config(folder: Path, cfg: ModelConfig) -> tuple[SamplingParams, tuple[int, ...]]:
    """Sampling defaults and EOS ids from ``generation_config.json`` (greedy and the config's EOS without it)."""
    path = folder / "generation_config.json"
    if not files.present(path):
        return SamplingParams(), cfg.eos_token_ids
    raw = files.read_json_object(path, folder)
    source = str(path)

    def number(key: str, default: float, low: float, high: float = math.inf, above: bool = False) -> float:
        value = raw.get(key)
        return default if value is None else real(value, key, source, low, high, above=above)

    eos = raw.get("eos_token_id")
    eos_ids = cfg.eos_token_ids if eos is None else token_ids(eos, "eos_token_id", source, cfg.vocab_size)
    if not flag(raw.get("do_sample"), "do_sample", source):
        return SamplingParams(repetition_penalty=number("repetition_penalty", 1.0, 0.0, above=True)), eos_ids
    top_k = raw.get("top_k")
    params = SamplingParams(
        temperature=number("temperature", 1.0, 0.0),
        top_k=0 if top_k is None else whole(top_k, "top_k", source, 0, MAX_VOCAB),
        top_p=number("top_p", 1.0, 0.0, 1.0, above=True),
        min_p=number("min_p", 0.0, 0.0, 1.0),
        repetition_penalty=number("repetition_penalty", 1.0, 0.0, above=True),
    )
    return params, eos_ids
