"""One decode loop for every request: continuous batching.

The engine thread owns the model. Requests wait in a queue; between two decode steps the loop admits
as many as there are free places in the batch, and drops those that finished or whose client went
away. The prompts admitted together run in one prefill (the weights read once for all of them), each
past the longest prefix a cache already holds. Each step runs the next
token of every running sequence in one native call (``Transformer.decode_batch``: the weights are
read once for the whole batch, which is what makes many users cheaper than one after the other),
then samples each sequence's token under its own settings, seed, stop strings and grammar, and hands
the text to the request's queue on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from torchburn_llm.llm import LLM, PROMPT_TAIL
from torchburn_llm.model import KVCache
from torchburn_llm.sampling import Sampler, SamplingParams
from torchburn_llm.streaming import TextStream

from .errors import APIError
from .grammar import Constraint, GrammarError
from .limits import Limits
from .prefix_cache import PrefixCache, cache_bytes, common_prefix

log = logging.getLogger("torchburn.serve")
CACHE_GRANULE = 256  # KV caches are sized in multiples of this many positions
CANCELLED = "cancelled"  # the finish of a job whose client went away (never sent to a client)
# A request waits for the next round of prefills, instead of joining this one, where a prompt of this
# round would lend it at least this many more positions than any cache holds now: a copied prefix
# saves its tokens' compute (about a millisecond each on a small model), joining a round saves one
# pass over the weights (worth a few prompt tokens).
PREFIX_OVER_ROUND = 16


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    text: str
    logprob: float
    top: list[tuple[int, str, float]]  # (id, text, logprob) of the most likely tokens, best first


@dataclass
class Delta:
    """What one step adds to a request's answer; the last one has ``finish`` (or ``error``)."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: str | None = None  # "stop" (EOS, a stop string, the grammar's end), "length" or CANCELLED
    stop_sequence: str | None = None  # the stop string that ended the answer, with the last delta
    error: APIError | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose keys and values came from an earlier request
    made: float = field(default_factory=time.monotonic)  # when the engine produced it


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...] = ()
    top_logprobs: int | None = None  # None: no logprobs; n: the sampled token's and the n best
    constraint: Constraint | None = None


class Handle:
    """A submitted job as the event loop sees it: its deltas arrive on an asyncio queue."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.job, self._loop = job, loop
        self._queue: asyncio.Queue[Delta] = asyncio.Queue()
        self.cancelled = False

    def put(self, delta: Delta) -> None:
        post(self._loop, [(self, delta)])

    def cancel(self) -> None:
        """Stop generating (the client went away); the engine frees the sequence's KV cache."""
        self.cancelled = True

    async def deltas(self) -> AsyncIterator[Delta]:
        while True:
            delta = await self._queue.get()
            yield delta
            if delta.finish is not None or delta.error is not None:
                return


def post(loop: asyncio.AbstractEventLoop, deliveries: list[tuple[Handle, Delta]]) -> None:
    """Hands every delta to its request's queue in one wake-up of the event loop (a step's deltas go
    together: one wake-up per step, not one per sequence)."""
    if not deliveries:
        return

    def deliver() -> None:
        for handle, delta in deliveries:
            handle._queue.put_nowait(delta)

    try:
        loop.call_soon_threadsafe(deliver)
    except RuntimeError:  # the event loop is gone: the server is shutting down
        pass


@dataclass
class _Sequence:
    handle: Handle
    cache: KVCache
    ids: list[int]  # the tokens whose keys and values the cache holds
    sampler: Sampler
    text: TextStream
    cached: int
    generated: int = 0
    next_token: int = -1  # sampled, to run in the next step
    done: bool = False

    @property
    def job(self) -> Job:
        return self.handle.job


class Engine:
    def __init__(self, llm: LLM, limits: Limits) -> None:
        self.llm, self.model, self.limits = llm, llm.model, limits
        self.eos = frozenset(llm.eos_ids)
        self._incoming: queue.SimpleQueue[Handle | _Call] = queue.SimpleQueue()
        self._waiting: deque[Handle] = deque()
        self._active: list[_Sequence] = []
        self._prefixes = PrefixCache(limits.prefix_cache_bytes)
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="torchburn-engine", daemon=True)
        self.steps = 0  # batched decode steps run
        self.step_tokens = 0  # tokens those steps decoded
        self.prefill_rounds = 0  # prefills run, each of one or more prompts
        self.prefill_prompts = 0  # prompts those rounds ran
        self.prompt_tokens = 0  # prompt tokens computed
        self.cached_prompt_tokens = 0  # prompt tokens whose keys and values came from a cache instead
        self.generated_tokens = 0  # tokens sampled into answers (as usage counts them)
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "error": 0}  # requests ended, by how
        self._outbox: list[tuple[Handle, Delta]] | None = None  # a running step's deltas
        self._token_text = lru_cache(maxsize=65536)(self._decode_one)

    # --- from the event loop -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, handle: Handle) -> None:
        self._incoming.put(handle)
        self._wake.set()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn`` on the engine thread between two steps (the model is not shared between threads)."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._incoming.put(_Call(fn, future))
        self._wake.set()
        return future

    def stop(self) -> None:
        """Ask the thread to finish its current step and answer every request still open with a 503
        (without waiting: a signal handler calls this)."""
        self._stopping = True
        self._wake.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        """:meth:`stop`, then wait for the thread."""
        self.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def stats(self) -> dict[str, int]:
        active = list(self._active)
        return {
            "requests_decoding": len(active),
            "requests_waiting": len(self._waiting) + self._incoming.qsize(),
            "kv_cache_bytes": sum(cache_bytes(s.cache) for s in active),
            "prefix_cache_entries": len(self._prefixes),
            "prefix_cache_bytes": self._prefixes.nbytes,
            "decode_steps": self.steps,
            "decode_step_tokens": self.step_tokens,
            "prefill_rounds": self.prefill_rounds,
            "prefill_prompts": self.prefill_prompts,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated_tokens,
        }

    # --- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.clear()
            self._drain()
            if self._stopping:
                break
            try:
                self._drop_cancelled()
                self._admit()
                if self._active:
                    self._step()
                elif not self._waiting:
                    self._wake.wait(0.5)
            except Exception as exc:  # a bug must not take the loop down: the server would hang
                log.exception("the decode loop failed")
                self._fail_all(
                    APIError(500, f"generation failed: {type(exc).__name__}: {exc}", code="generation_failed")
                )
        self._fail_all(APIError(503, "the server is shutting down", code="server_shutting_down"))
        self._prefixes.clear()

    def _fail_all(self, error: APIError) -> None:
        """End every running and waiting request with ``error``."""
        for seq in self._active:
            if not seq.done:
                seq.handle.put(Delta(error=error))
                self.finished["error"] += 1
        for handle in self._waiting:
            handle.put(Delta(error=error))
            self.finished["error"] += 1
        self._active, self._waiting = [], deque()

    def _drain(self) -> None:
        while True:
            try:
                item = self._incoming.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call):
                item.run()
            else:
                self._waiting.append(item)

    def _drop_cancelled(self) -> None:
        kept = []
        for seq in self._active:
            if seq.handle.cancelled:
                seq.done = True  # its cache goes with it
                seq.handle.put(Delta(finish=CANCELLED))
            else:
                kept.append(seq)
        self._active = kept

    def _admit(self) -> None:
        """Admit waiting requests while the batch has room, a round of them at a time: a round's
        prompts run in one prefill, which reads the weights once for all of them."""
        while self._waiting and len(self._active) < self.limits.max_batch:
            self._prefill(self._next_round())

    def _next_round(self) -> list[tuple[Handle, KVCache, int]]:
        """The requests of the next round of prefills, each with its cache and the prefix it reuses."""
        round_: list[tuple[Handle, KVCache, int]] = []
        while self._waiting and len(self._active) + len(round_) < self.limits.max_batch:
            handle = self._waiting[0]
            if handle.cancelled:
                self._waiting.popleft()
                handle.put(Delta(finish=CANCELLED))
                continue
            prompt = handle.job.prompt
            capacity = self._capacity(handle.job)
            from_round = max((common_prefix(h.job.prompt, prompt) for h, _, _ in round_), default=0)
            if round_ and from_round >= self._available_prefix(prompt, capacity) + PREFIX_OVER_ROUND:
                break  # the next round copies that prefix from this one
            self._waiting.popleft()
            try:
                cache, reused = self._cache_for(prompt, capacity)
            except Exception as exc:
                log.exception("no KV cache for a request")
                handle.put(Delta(error=APIError(500, f"generation failed: {exc}", code="generation_failed")))
                continue
            reused = max(0, min(reused, len(prompt) - PROMPT_TAIL))  # the answer a fresh prompt gets
            cache.reset(reused)
            round_.append((handle, cache, reused))
        return round_

    def _capacity(self, job: Job) -> int:
        need = len(job.prompt) + job.max_tokens
        return min(self.llm.config.max_position, -(-need // CACHE_GRANULE) * CACHE_GRANULE)

    def _prefill(self, round_: list[tuple[Handle, KVCache, int]]) -> None:
        """Run a round's prompts (past their reused prefixes) and start their sequences."""
        if not round_:
            return
        try:
            logits = self.model.prefill_batch(
                [h.job.prompt[reused:] for h, _, reused in round_], [c for _, c, _ in round_]
            )
        except Exception as exc:
            log.exception("prefill failed")
            failure = APIError(500, f"generation failed: {exc}", code="generation_failed")
            for handle, _, _ in round_:
                handle.put(Delta(error=failure))
            self.finished["error"] += len(round_)
            return
        self.prefill_rounds += 1
        self.prefill_prompts += len(round_)
        for handle, _, reused in round_:
            self.prompt_tokens += len(handle.job.prompt) - reused
            self.cached_prompt_tokens += reused
        tokenizer = self.llm.tokenizer
        for (handle, cache, reused), row in zip(round_, logits, strict=True):
            job = handle.job
            seq = _Sequence(
                handle, cache, list(job.prompt), Sampler(job.params), TextStream(tokenizer, job.stop), reused
            )
            self._next(seq, row)
            if not seq.done:
                self._active.append(seq)

    def _available_prefix(self, prompt: Sequence[int], capacity: int) -> int:
        """How long a prefix of ``prompt`` the running sequences and idle caches hold."""
        return max(self._running_donor(prompt)[1], self._prefixes.longest(prompt, capacity))

    def _running_donor(self, prompt: Sequence[int]) -> tuple[_Sequence | None, int]:
        """The running sequence sharing the longest prefix with ``prompt`` (None: none shares any),
        and that length."""
        donor, shared = None, 0
        for seq in self._active:
            n = common_prefix(seq.ids, prompt)
            if n > shared:
                donor, shared = seq, n
        return donor, shared

    def _cache_for(self, prompt: Sequence[int], capacity: int) -> tuple[KVCache, int]:
        """A cache of ``capacity`` positions holding as long a prefix of ``prompt`` as any cache has:
        an idle one taken over, or a running sequence's prefix copied."""
        donor, shared = self._running_donor(prompt)
        taken = self._prefixes.take(prompt, capacity, longer_than=shared)
        if taken is not None:
            return taken
        cache = self.model.new_cache(capacity)
        if donor is not None:
            # [L, KVH, S, D]: the shared positions of every layer and head
            cache.keys[:, :, :shared] = donor.cache.keys[:, :, :shared]
            cache.values[:, :, :shared] = donor.cache.values[:, :, :shared]
            cache.length = shared
        return cache, shared

    def _step(self) -> None:
        seqs = self._active
        tokens = [s.next_token for s in seqs]
        try:
            logits = self._decode(tokens, [s.cache for s in seqs])  # [B, V]
        except Exception as exc:
            log.exception("decode step failed")
            failure = APIError(500, f"generation failed: {exc}", code="generation_failed")
            for seq in seqs:
                seq.handle.put(Delta(error=failure))
            self._active = []
            return
        self.steps += 1
        self.step_tokens += len(seqs)
        self._outbox = []
        try:
            for seq, token, row in zip(seqs, tokens, logits, strict=True):
                seq.ids.append(token)
                self._next(seq, row)
        finally:
            outbox, self._outbox = self._outbox, None
            for loop in {id(h._loop): h._loop for h, _ in outbox}.values():
                post(loop, [(h, d) for h, d in outbox if h._loop is loop])
        self._active = [s for s in seqs if not s.done]

    def _send(self, handle: Handle, delta: Delta) -> None:
        """``delta`` to ``handle``: at the end of the step when a step is running, else now."""
        if self._outbox is not None:
            self._outbox.append((handle, delta))
        else:
            handle.put(delta)

    def _decode(self, tokens: list[int], caches: list[KVCache]) -> torch.Tensor:
        logits: torch.Tensor = self.model.decode_batch(tokens, caches)  # [B, V]
        return logits

    def _next(self, seq: _Sequence, logits: torch.Tensor) -> None:
        """Sample ``seq``'s next token from ``logits`` [V] and hand on what it adds. Whatever goes wrong
        in one request (a grammar its schema cannot satisfy after all) ends that request with an error
        and leaves the others running."""
        try:
            self._sample(seq, logits)
        except GrammarError as exc:
            self._fail(seq, f"the output grammar cannot go on: {exc}", status=400)
        except Exception as exc:
            log.exception("a request failed while sampling")
            self._fail(seq, f"generation failed: {type(exc).__name__}: {exc}")

    def _sample(self, seq: _Sequence, logits: torch.Tensor) -> None:
        job = seq.job
        scores = logits
        if job.constraint is not None:
            scores = job.constraint.mask(logits)
            if not bool(torch.isfinite(scores).any()):
                raise GrammarError(f"it allows no next token ({job.constraint.error or 'a dead end'})")
        token = seq.sampler(scores, seq.ids)
        delta = Delta(prompt_tokens=len(job.prompt), cached_tokens=seq.cached)
        if token in self.eos:  # under a grammar, only allowed once the answer is complete
            self._finish(seq, delta, "stop")
            return
        if job.top_logprobs is not None:
            delta.logprobs.append(self._logprob(logits, token, job.top_logprobs))
        seq.generated += 1
        self.generated_tokens += 1
        if job.constraint is not None:
            job.constraint.advance(token)
        delta.text = seq.text.push(token)
        if seq.text.stopped or (job.constraint is not None and job.constraint.done):
            self._finish(seq, delta, "stop")
        elif seq.generated >= job.max_tokens:
            self._finish(seq, delta, "length")
        else:
            seq.next_token = token
            delta.completion_tokens = seq.generated
            self._send(seq.handle, delta)

    def _finish(self, seq: _Sequence, delta: Delta, reason: str) -> None:
        delta.text += seq.text.finish()
        delta.finish, delta.completion_tokens = reason, seq.generated
        delta.stop_sequence = seq.text.stopped_by
        seq.done = True
        self.finished[reason] = self.finished.get(reason, 0) + 1
        if not seq.handle.cancelled:  # before the delta goes out: its reader cancels once it has it
            self._prefixes.put(seq.ids, seq.cache)
        self._send(seq.handle, delta)

    def _fail(self, seq: _Sequence, message: str, status: int = 500) -> None:
        seq.done = True
        self.finished["error"] += 1
        self._send(seq.handle, Delta(error=APIError(status, message, code="generation_failed")))

    def _logprob(self, logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
        logp = torch.log_softmax(logits.float(), dim=-1)
        best = torch.topk(logp, top) if top > 0 else None
        listed = [] if best is None else list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
        return TokenLogprob(
            token,
            self._token_text(token),
            float(logp[token]),
            [(i, self._token_text(i), v) for i, v in listed],
        )

    def _decode_one(self, token: int) -> str:
        return str(self.llm.tokenizer.decode([token], skip_special_tokens=False))


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any]

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:
            self.future.set_exception(exc)
