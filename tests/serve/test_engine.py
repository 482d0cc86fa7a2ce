"""The engine's admission of requests that arrive together: their prompts run in one prefill round
(one native call for all of them), unless one would rather copy a long prefix that another of them is
about to compute; either way each greedy answer is the one the prompt gets alone."""

from __future__ import annotations

import asyncio

import torch
from torchburn_native.transformer import PROMPT_KERNEL_MIN_TOKENS

from torchburn_llm import LLM
from torchburn_llm.sampling import SamplingParams
from torchburn_serve.engine import PREFIX_OVER_ROUND, Delta, Engine, Handle, Job
from torchburn_serve.grammar import GrammarError
from torchburn_serve.limits import Limits

TOKENS = 12


def _serve_together(llm: LLM, prompts: list[list[int]]) -> tuple[list[tuple[str, int]], dict[str, int]]:
    """Every prompt submitted before the engine starts (so they all wait for its first admission):
    each answer's text and cached prompt tokens, and the engine's counters after."""
    engine = Engine(llm, Limits())

    async def main() -> list[tuple[str, int]]:
        loop = asyncio.get_running_loop()
        handles = [Handle(Job(p, TOKENS, SamplingParams()), loop) for p in prompts]
        for handle in handles:
            engine.submit(handle)
        engine.start()
        answers = []
        for handle in handles:
            deltas = [d async for d in handle.deltas()]
            assert deltas[-1].error is None and deltas[-1].finish in ("stop", "length")
            answers.append(("".join(d.text for d in deltas), deltas[-1].cached_tokens))
        return answers

    try:
        answers = asyncio.run(main())
    finally:
        engine.shutdown()
    return answers, engine.stats()


def _alone(llm: LLM, prompt: list[int]) -> str:
    return str(llm.tokenizer.decode(llm.generate_ids(prompt, TOKENS), skip_special_tokens=False))


def test_prompts_arriving_together_run_in_one_round(llm: LLM) -> None:
    texts = [
        "The capital of France, the country of cheese and wine, is",
        "Once upon a time, in a small village by the sea, there lived",
        "def fibonacci(n):\n    # the n-th Fibonacci number\n    ",
        "Three colours of the rainbow, in the order they appear, are",
    ]
    prompts = [llm.encode(t) for t in texts]
    assert len({p[0] for p in prompts}) == len(prompts)  # nothing shared to copy
    assert min(len(p) for p in prompts) >= PROMPT_KERNEL_MIN_TOKENS  # all on the prompt kernels
    calls = llm.model.native_batched_prefills
    answers, stats = _serve_together(llm, prompts)
    assert (stats["prefill_rounds"], stats["prefill_prompts"]) == (1, len(prompts))
    assert llm.model.native_batched_prefills == calls + 1
    for prompt, (text, cached) in zip(prompts, answers, strict=True):
        assert cached == 0
        assert text == _alone(llm, prompt)


def test_a_long_shared_prefix_is_computed_once_then_copied(llm: LLM) -> None:
    system = llm.encode("You are a careful assistant. Answer every question in one short sentence. " * 3)
    assert len(system) >= 2 * PREFIX_OVER_ROUND
    questions = ["What is the capital of France?", "Name a fruit.", "What is two plus two?"]
    prompts = [system + llm.encode(f"\nQuestion: {q}\nAnswer:") for q in questions]
    answers, stats = _serve_together(llm, prompts)
    # the first alone; the others then copy its prefix, and run together
    assert (stats["prefill_rounds"], stats["prefill_prompts"]) == (2, len(prompts))
    assert answers[0][1] == 0
    assert all(cached >= len(system) - 1 for _, cached in answers[1:])
    for prompt, (text, _) in zip(prompts, answers, strict=True):
        assert text == _alone(llm, prompt)


def test_a_cancelled_request_is_dropped_from_its_round(llm: LLM) -> None:
    engine = Engine(llm, Limits())

    async def main() -> list[str | None]:
        loop = asyncio.get_running_loop()
        prompts = [llm.encode("The capital of France is"), llm.encode("Once upon a time, there lived")]
        handles = [Handle(Job(p, 4, SamplingParams()), loop) for p in prompts]
        for handle in handles:
            engine.submit(handle)
        handles[0].cancel()
        engine.start()
        finishes = []
        for handle in handles:
            deltas = [d async for d in handle.deltas()]
            finishes.append(deltas[-1].finish)
        return finishes

    try:
        finishes = asyncio.run(main())
    finally:
        engine.shutdown()
    assert finishes[0] == "cancelled" and finishes[1] in ("stop", "length")
    assert engine.stats()["prefill_prompts"] == 1


class _FailingConstraint:
    """A grammar that gives up at its second token, as llguidance does past one of its limits, or
    breaks outright."""

    def __init__(self, error: Exception) -> None:
        self.error_to_raise, self.taken, self.error, self.done = error, 0, "", False

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def advance(self, token: int) -> None:
        self.taken += 1
        if self.taken == 2:
            raise self.error_to_raise


def test_a_request_whose_grammar_fails_ends_alone(llm: LLM) -> None:
    # one request's failure is that request's error; the others and the loop go on
    prompt = llm.encode("The capital of France is")
    engine = Engine(llm, Limits())
    failures = [GrammarError("over a limit"), ValueError("a bug")]

    async def main() -> list[list[Delta]]:
        loop = asyncio.get_running_loop()
        jobs = [Job(prompt, TOKENS, SamplingParams(), constraint=_FailingConstraint(e)) for e in failures]  # type: ignore[arg-type]
        handles = [Handle(job, loop) for job in [*jobs, Job(prompt, TOKENS, SamplingParams())]]
        for handle in handles:
            engine.submit(handle)
        engine.start()
        answers = []
        for handle in handles:
            answers.append([d async for d in handle.deltas()])
        later = Handle(Job(prompt, TOKENS, SamplingParams()), loop)  # the loop still runs
        engine.submit(later)
        return [*answers, [d async for d in later.deltas()]]

    try:
        grammar_failed, bug, fine, later = asyncio.run(main())
    finally:
        engine.shutdown()
    assert grammar_failed[-1].error is not None and grammar_failed[-1].error.status == 400
    assert "over a limit" in grammar_failed[-1].error.message
    assert bug[-1].error is not None and bug[-1].error.status == 500 and "ValueError: a bug" in bug[-1].error.message
    alone = _alone(llm, prompt)
    assert "".join(d.text for d in fine) == alone and "".join(d.text for d in later) == alone
