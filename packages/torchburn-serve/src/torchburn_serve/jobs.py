"""From a validated request to what the engine runs: the prompt's token ids (through the chat
template), the length limits, the sampling settings and the grammar its answer must follow."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from torchburn_llm.errors import ChatTemplateError
from torchburn_llm.llm import LLM

from . import reasoning, tools
from .engine import Job
from .errors import APIError, bad_request
from .grammar import Constraint, Vocabulary
from .limits import Limits
from .protocol import ChatRequest, CompletionRequest, Sampling

_SEED_BITS = (1 << 64) - 1


@dataclass
class ChatJob:
    job: Job
    tool_plan: tools.ToolPlan | None
    # None: the answer's thinking stays in its content; else whether the prompt leaves it thinking
    thinking: bool | None = None


class JobMaker:
    def __init__(self, llm: LLM, limits: Limits) -> None:
        self.llm, self.limits = llm, limits
        self._vocabulary: Vocabulary | None = None
        self._lock = threading.Lock()
        # a template for requests with tools, or a chat template that reads them, formats tools itself
        self.template_knows_tools = llm.tool_chat_template is not None or "tools" in (llm.chat_template or "")

    @property
    def context(self) -> int:
        return int(self.llm.config.max_position)

    def vocabulary(self) -> Vocabulary:
        with self._lock:
            if self._vocabulary is None:
                if self.llm.tokenizer is None:
                    raise bad_request("this model has no tokenizer, which constrained output needs")
                self._vocabulary = Vocabulary(self.llm.tokenizer, self.llm.config.vocab_size, self.llm.eos_ids)
            return self._vocabulary

    # --- chat ----------------------------------------------------------------------------------

    def chat_prompt(self, req: ChatRequest) -> tuple[str, tools.ToolPlan | None]:
        """The prompt text ``req``'s messages (and tools) make through the model's chat template, and how
        the request calls tools."""
        if self.llm.chat_template is None:
            raise bad_request("this model ships no chat template; use /v1/completions with a plain prompt", "messages")
        plan = tools.plan(
            tools.parse_tools(req.tools), req.tool_choice, self.template_knows_tools, req.parallel_tool_calls
        )
        messages = req.plain_messages(native_tools=plan is not None and plan.native)
        # a conversation that ends with the assistant's words is continued from them, as llama-server and
        # ollama do (the answer starts where the given text stops: "prefill")
        prefill = ""
        if len(messages) > 1 and messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]:
            prefill = messages.pop()["content"]
        extra: dict[str, Any] = dict(req.chat_template_kwargs or {})
        if plan is not None and plan.native:
            extra["tools"] = [t.as_openai() for t in plan.tools]
        elif plan is not None:
            messages = tools.generic_messages(messages, plan)
        try:
            text = self.llm.apply_chat_template(messages, True, **extra)
        except (ChatTemplateError, ValueError) as exc:
            raise bad_request(str(exc), "messages") from None
        return text + prefill, plan

    def chat(self, req: ChatRequest) -> ChatJob:
        """Runs in a worker thread: templating, tokenizing and compiling a grammar take milliseconds."""
        text, plan = self.chat_prompt(req)
        prompt = self._encode(text, "messages")
        schema, param = None, None
        if plan is not None and plan.schema is not None:
            schema, param = plan.schema, "tools"
        elif req.response_format is not None and req.response_format.type == "json_object":
            schema, param = {"type": "object"}, "response_format"
        elif req.response_format is not None and req.response_format.type == "json_schema":
            fmt = req.response_format.json_schema
            if fmt is None or fmt.schema_ is None:
                raise bad_request("response_format json_schema needs json_schema.schema", "response_format")
            schema, param = fmt.schema_, "response_format"
        constraint = None if schema is None else self._constraint(schema, param or "response_format")
        top = (req.top_logprobs or 0) if req.logprobs else None
        job = self._job(req, prompt, req.requested_tokens(), top, constraint)
        thinking = None if req.reasoning_format == "none" else reasoning.prompt_opens_thinking(text)
        return ChatJob(job, plan, thinking)

    # --- text completions ----------------------------------------------------------------------

    def completions(self, req: CompletionRequest) -> list[tuple[Job, str]]:
        """A job (and its prompt's text) per prompt of ``req``: OpenAI's text completions take a list of
        prompts (clients batch them: LangChain sends up to 20 at once), answered as choices in order."""
        prompts = req.prompts()
        if len(prompts) == 1:
            return [self.completion(req)]
        if len(prompts) > self.limits.max_requests:
            raise bad_request(
                f"{len(prompts)} prompts in one request; this server takes at most {self.limits.max_requests}",
                "prompt",
            )
        return [self.completion(req.model_copy(update={"prompt": [p]})) for p in prompts]

    def completion(self, req: CompletionRequest, schema: dict[str, Any] | None = None) -> tuple[Job, str]:
        """The job and the prompt's text (for ``echo``); the answer follows ``schema`` where one is given
        (llama-server's ``/completion`` takes one)."""
        prompts = req.prompts()
        if len(prompts) != 1:
            raise bad_request("one prompt per request is supported here", "prompt")
        prompt = prompts[0]
        if isinstance(prompt, str):
            ids, text = self._encode(prompt, "prompt"), prompt
        else:
            ids = list(prompt)
            vocab = self.llm.config.vocab_size
            if not ids or any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise bad_request(f"prompt token ids must be a non-empty list of ints in [0, {vocab})", "prompt")
            text = str(self.llm.tokenizer.decode(ids)) if self.llm.tokenizer is not None else ""
        constraint = None if schema is None else self._constraint(schema, "json_schema")
        return self._job(req, ids, req.max_tokens, req.logprobs, constraint), text

    # --- shared --------------------------------------------------------------------------------

    def _encode(self, text: str, param: str) -> list[int]:
        try:
            ids = self.llm.prompt_ids(text)  # after the BOS the model expects
        except ValueError as exc:
            raise bad_request(str(exc), param) from None
        if not ids:
            raise bad_request("the prompt is empty", param)
        return ids

    def prompt_limit(self) -> int:
        return min(self.limits.max_prompt_tokens or self.context - 1, self.context - 1)

    def check_prompt(self, n: int, param: str) -> None:
        if n > self.prompt_limit():
            raise APIError(
                400,
                f"the prompt has {n} tokens; this server takes at most {self.prompt_limit()}",
                param=param,
                code="context_length_exceeded",
            )

    def _job(
        self, req: Sampling, prompt: list[int], requested: int | None, top: int | None, constraint: Constraint | None
    ) -> Job:
        self.check_prompt(len(prompt), "messages" if isinstance(req, ChatRequest) else "prompt")
        room = self.context - len(prompt)
        if requested is None:
            max_new = min(self.limits.max_tokens, room)
        elif requested > self.limits.max_tokens:
            raise bad_request(
                f"max_tokens is {requested}; this server generates at most {self.limits.max_tokens}", "max_tokens"
            )
        elif requested > room:
            raise APIError(
                400,
                f"{len(prompt)} prompt tokens + max_tokens {requested} exceed the model's context of {self.context}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        else:
            max_new = requested
        stop = req.stop_strings()
        if len(stop) > self.limits.max_stop:
            raise bad_request(f"at most {self.limits.max_stop} stop strings", "stop")
        biases = req.token_biases()
        vocab = self.llm.config.vocab_size
        if any(token >= vocab for token, _ in biases):
            raise bad_request(f"logit_bias names a token id outside this model's vocabulary of {vocab}", "logit_bias")
        try:
            params = self.llm.defaults.updated(
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k,
                min_p=req.min_p,
                repetition_penalty=req.repetition_penalty or req.repeat_penalty,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                logit_bias=biases or None,
                seed=None if req.seed is None else req.seed & _SEED_BITS,
            )
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        return Job(prompt, max_new, params, stop, top, constraint)

    def _constraint(self, schema: dict[str, Any], param: str) -> Constraint:
        return self.vocabulary().json_schema(schema, param)
