"""``torchburn bench-serve``: concurrent streaming clients against ``torchburn serve`` and, in the same
run, llama-cpp-python's OpenAI server on the same GGUF file and threads.

Each round starts ``C`` clients at once; each sends ``requests`` chat requests one after the other
(different prompts, greedy, ``max_tokens`` each) and streams the answers. Reported per server and ``C``:
the aggregate completion tokens per second over the round's wall time, and the time to first token
(request sent to first content) at the median and the 95th percentile over all requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

TOPICS = [
    "a lighthouse keeper", "a robot learning to paint", "the history of bread", "a journey to Mars",
    "a forest in winter", "an old clock", "a chess tournament", "the ocean at night", "a city of bridges",
    "a lost letter", "a mountain village", "a summer storm", "a library of maps", "a train across Asia",
    "a tiny dragon", "the first snowfall",
]  # fmt: skip
STARTUP_S = 180.0


@dataclass
class Round:
    server: str
    clients: int
    requests: int
    tokens: int
    seconds: float
    ttft: list[float]
    short: int = 0  # requests answered with fewer than ``max_tokens`` tokens (a stop, or cut off)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(time to first token, completion tokens) of one streamed chat request."""
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first: float | None = None
    pieces, usage = 0, None
    async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    pieces += 1
                    if first is None:
                        first = time.perf_counter() - sent
    return (first if first is not None else time.perf_counter() - sent), (usage if usage is not None else pieces)


async def _round(url: str, name: str, clients: int, requests: int, max_tokens: int) -> Round:
    async def client_loop(client: httpx.AsyncClient, c: int) -> list[tuple[float, int]]:
        out = []
        for r in range(requests):
            topic = TOPICS[(c * requests + r) % len(TOPICS)]
            out.append(await _one(client, url, f"Write a long story about {topic}.", max_tokens))
        return out

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(client_loop(client, c) for c in range(clients)))
        seconds = time.perf_counter() - start
    flat = [x for per in results for x in per]
    short = sum(t < max_tokens for _, t in flat)
    return Round(name, clients, len(flat), sum(t for _, t in flat), seconds, [f for f, _ in flat], short)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Process:
    def __init__(self, name: str, command: list[str], port: int, log: Path) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.process.returncode}: see {log}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{name} did not start within {STARTUP_S:.0f} s: see {log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_torchburn(model: str | None, log_dir: Path, max_batch: int) -> _Process:
    port = _free_port()
    command = [sys.executable, "-c", "from torchburn_cli.app import main; main()", "serve", "--port", str(port)]
    command += ["--max-batch", str(max_batch), "--max-requests", "256"]
    if model is not None:
        command += ["--model", model]
    return _Process("torchburn serve", command, port, log_dir / "torchburn-serve.log")


def start_llama_cpp(model: Path, threads: int, log_dir: Path) -> _Process:
    port = _free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads)]
    # by default a new request interrupts the one running: requests must queue instead, as each
    # client here waits for all of its answer
    command += ["--n_ctx", "4096", "--verbose", "False", "--interrupt_requests", "False"]
    return _Process("llama-cpp-python server", command, port, log_dir / "llama-cpp-server.log")


def run(
    model: str | None,
    gguf: Path | None,
    concurrency: Sequence[int],
    requests: int,
    max_tokens: int,
    threads: int,
    log_dir: Path,
    max_batch: int = 16,
) -> list[Round]:
    """Every server, every concurrency: ours first, then llama-cpp-python's where ``gguf`` names its file.
    Each server runs alone (the other is stopped) so that they do not share the cores."""
    log_dir.mkdir(parents=True, exist_ok=True)
    rounds: list[Round] = []
    servers: list[tuple[str, Callable[[], _Process]]] = [
        ("torchburn", lambda: start_torchburn(model, log_dir, max_batch))
    ]
    if gguf is not None:
        servers.append(("llama.cpp", lambda: start_llama_cpp(gguf, threads, log_dir)))
    for name, start in servers:
        proc = start()
        try:
            asyncio.run(_round(proc.url, name, 1, 1, 8))  # warm-up: first-call costs out of the numbers
            for c in concurrency:
                rounds.append(asyncio.run(_round(proc.url, name, c, requests, max_tokens)))
                print(format_row(rounds[-1], rounds), flush=True)
                if rounds[-1].short:
                    print(f"  ({short_note(rounds[-1])})", flush=True)
        finally:
            proc.stop()
    return rounds


HEADER = (
    "| server | clients | requests | tokens | aggregate tok/s | vs 1 client | TTFT p50 (s) | TTFT p95 (s) |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def short_note(r: Round) -> str:
    """What to know of a round whose answers were not all of full length: its tok/s counts only the
    tokens sent, and a cut-off answer's time to first token may be its time to end."""
    return f"{r.short} of {r.requests} {r.server} answers ended before max_tokens"


def format_row(r: Round, rounds: Sequence[Round]) -> str:
    one = next((x for x in rounds if x.server == r.server and x.clients == 1), None)
    ratio = f"{r.tok_s / one.tok_s:.2f}x" if one is not None else "-"
    return (
        f"| {r.server} | {r.clients} | {r.requests} | {r.tokens} | {r.tok_s:.1f} | {ratio} | "
        f"{statistics.median(r.ttft):.3f} | {r.percentile(0.95):.3f} |"
    )
