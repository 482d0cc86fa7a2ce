"""The ``torchburn`` command. User mistakes print one line and exit 2; bugs keep their traceback.

It behaves like a Unix tool: Ctrl-C exits 130 (128 + SIGINT) without a traceback, and when the reader of
its output goes away (``torchburn generate ... | head -c 10``) it stops quietly with 141 (128 + SIGPIPE,
the status the shell reports for any producer whose reader quit), so ``set -o pipefail`` scripts see the
same as for ``yes | head``. Text arguments must be valid UTF-8.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .models import list_models, pull, rm
from .options import DeviceOpt, MaxOpt, ModelOpt, QuantOpt
from .serve import bench_serve, serve

app = typer.Typer(
    help="TorchBurn: a torch.compile backend with its own engines, and a local LLM runtime.", no_args_is_help=True
)
llm_app = typer.Typer(help="Run language models locally (python -m torchburn.llm).", no_args_is_help=True)
cache_app = typer.Typer(help="TorchBurn's compiled-program cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")
err = Console(stderr=True)

Command = TypeVar("Command", bound=Callable[..., Any])
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE


class StdoutClosed(Exception):
    """The reader of stdout went away. Not an OSError, so that typer passes it on to :func:`_run`."""


def _unix(command: Command) -> Command:
    """``command`` with a closed stdout reported as :class:`StdoutClosed` (typer would turn the
    BrokenPipeError into exit 1 and leave Python to complain at exit)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            result = command(*args, **kwargs)
            sys.stdout.flush()  # what is still buffered fails here, not at exit
            return result
        except BrokenPipeError as exc:
            raise StdoutClosed from exc

    return run  # type: ignore[return-value]


def _utf8(value: str, what: str) -> str:
    """``value``, if it came from valid UTF-8 (Python keeps undecodable bytes of argv as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(value)
        shown = repr(raw[:40])[2:-1] + ("..." if len(raw) > 40 else "")
        raise ValueError(f"{what} is not valid UTF-8 text: '{shown}'; pass UTF-8") from None
    return value


def _load(model: str | None, quant: str | None, device: str) -> Any:
    import torchburn

    with Progress(
        TextColumn("loading {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(Path(model).name if model else "SmolLM2-135M-Instruct", total=None)
        return torchburn.LLM.from_pretrained(
            model,
            quant=quant,
            device=device,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )


def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt (sent through the model's chat template unless --raw)")],
    model: ModelOpt = None,
    quant: QuantOpt = None,
    device: DeviceOpt = "cpu",
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Print text as it is generated")] = True,
    raw: Annotated[bool, typer.Option("--raw", help="Continue the prompt as is, without the chat template")] = False,
    max_new_tokens: MaxOpt = 256,
    temperature: Annotated[
        float | None, typer.Option(help="0 = greedy [default: the model's generation config]")
    ] = None,
    top_k: Annotated[int | None, typer.Option(help="Sample from the k likeliest tokens")] = None,
    top_p: Annotated[float | None, typer.Option(help="Sample from the smallest set with this much probability")] = None,
    min_p: Annotated[
        float | None, typer.Option(help="Drop tokens below this fraction of the likeliest's probability")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Same seed, same text")] = None,
    stop: Annotated[list[str] | None, typer.Option(help="Stop before this text (repeatable)")] = None,
) -> None:
    """Generate a continuation of PROMPT."""
    _utf8(prompt, "the prompt")
    for stop_text in stop or ():
        _utf8(stop_text, "a --stop string")
    llm = _load(model, quant, device)
    text = (
        prompt if raw or llm.chat_template is None else llm.apply_chat_template([{"role": "user", "content": prompt}])
    )
    options = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "seed": seed,
        "stop": stop or (),
    }
    if stream:
        for piece in llm.stream(text, max_new_tokens, **options):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    else:
        print(llm.generate(text, max_new_tokens, **options))


def chat(
    model: ModelOpt = None,
    quant: QuantOpt = None,
    device: DeviceOpt = "cpu",
    system: Annotated[str | None, typer.Option(help="System prompt")] = None,
    max_new_tokens: MaxOpt = 512,
    temperature: Annotated[
        float | None, typer.Option(help="0 = greedy [default: the model's generation config]")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Same seed, same replies")] = None,
) -> None:
    """Chat with the model in the terminal (/exit or Ctrl-D to leave)."""
    if system is not None:
        _utf8(system, "the system prompt")
    llm = _load(model, quant, device)
    err.print("[dim]chat: /exit or Ctrl-D to leave[/dim]")
    llm.chat(system, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)


def benchmark(
    model: ModelOpt = None,
    quant: QuantOpt = None,
    device: DeviceOpt = "cpu",
    tokens: Annotated[int, typer.Option("--tokens", "-t", min=1, help="Tokens to decode")] = 64,
    prompt_tokens: Annotated[int, typer.Option(min=8, help="Prompt length for prefill")] = 128,
    reference: Annotated[
        bool, typer.Option("--reference/--no-reference", help="Also time transformers eager fp32")
    ] = True,
    repeats: Annotated[
        int, typer.Option("--repeats", "-r", min=1, help="Runs of each contender, interleaved; medians shown")
    ] = 3,
    llama_cpp: Annotated[
        bool,
        typer.Option(
            "--llama-cpp/--no-llama-cpp",
            help="Also time llama.cpp on the same GGUF file and threads (needs the llama-cpp extra)",
        ),
    ] = False,
) -> None:
    """Prefill and decode tokens/s and time to first token, next to transformers eager (and llama.cpp)
    in the same run."""
    import torch

    from torchburn_llm import benchmark as bench
    from torchburn_llm import default_model_path

    path = Path(model) if model else default_model_path()
    before = bench.resident_bytes()
    llm = _load(model, quant, device)
    ids = bench.prompt_ids(llm, prompt_tokens)
    # one run before any other runtime loads: the peak memory is then ours alone
    bench.measure_ours(llm, "warm-up", ids, tokens)
    session = llm._session
    kv_bytes = 0 if session is None else session.cache.keys.nbytes + session.cache.values.nbytes
    memory = bench.memory_line(before, llm, path, kv_bytes)
    contenders: list[tuple[str, Any]] = [(f"torchburn {llm.model.quant}", None)]
    if reference:
        contenders.append(("transformers fp32 eager", bench.load_transformers(path)))
    info = ""
    if llama_cpp:
        from torchburn_llm import llamacpp_peer

        if path.suffix != ".gguf":
            raise ValueError(f"--llama-cpp compares on a .gguf file; {path} is not one")
        info = llamacpp_peer.system_info()
        threads = torch.get_num_threads()
        contenders.append(("llama.cpp", llamacpp_peer.load(path, threads, prompt_tokens + tokens + 8)))
    runs: dict[str, list[bench.Speed]] = {name: [] for name, _ in contenders}
    for _ in range(repeats):  # interleaved, so that all see the same moments of a shared machine
        for name, peer in contenders:
            if peer is None:
                runs[name].append(bench.measure_ours(llm, name, ids, tokens))
            elif name == "llama.cpp":
                runs[name].append(llamacpp_peer.measure(peer, name, ids, tokens))
            else:
                runs[name].append(bench.measure_transformers(peer, name, ids, tokens))
    rows = [bench.median(r) for r in runs.values()]
    print(f"machine: {torch.get_num_threads()} threads, torch {torch.__version__}; medians of {repeats} runs")
    print(f"torchburn kernels: {_isa_level()}" + (f"; {info}" if info else ""))
    print(bench.HEADER)
    for r in rows:
        print(r.row())
    print(bench.ceiling_line(llm, rows[0].decode_tok_s))
    if memory is not None:
        print(memory)


def accuracy(
    model: ModelOpt = None,
    tokens: Annotated[int, typer.Option("--tokens", "-t", min=64, help="Length of the evaluation text")] = 2048,
    quant: Annotated[list[str] | None, typer.Option("--quant", "-q", help="Formats to compare with fp32")] = None,
    llama_cpp: Annotated[
        bool,
        typer.Option(
            "--llama-cpp/--no-llama-cpp",
            help="Compare with llama.cpp's logits on the same GGUF file instead of fp32 (needs the llama-cpp extra)",
        ),
    ] = False,
) -> None:
    """Top-1 agreement and perplexity of quantized weights against fp32 (or llama.cpp on the same file),
    teacher-forced on a long text, on the prefill path (prompts) and the decode path (one token per
    step, as generation runs). With --llama-cpp the first row is llama.cpp's own decode path against its
    prompt path: the agreement left when only the rounding differs; the last column then counts only
    the positions where llama.cpp's two paths agree. A second table then holds both runtimes, each path,
    against the exact computation of the file: its weights dequantized to fp32, and fp32 throughout."""
    from torchburn_llm import accuracy as acc

    # the fp32 model: the reference, or with --llama-cpp the file's exact computation
    reference: Any = _load(model, "fp32", "cpu")
    ids = reference.encode(acc.evaluation_text())[:tokens]
    if len(ids) < tokens:
        raise ValueError(f"the evaluation text has only {len(ids)} tokens")
    if llama_cpp:
        _accuracy_against_llama_cpp(model, reference, ids, quant or ["stored"])
        return
    rows = []
    for q in quant or ["int8", "int4"]:
        candidate = _load(model, q, "cpu")
        rows += [acc.compare(reference, candidate, ids, path) for path in acc.PATHS]
    print(acc.HEADER)
    for r in rows:
        print(r.row())


def _accuracy_against_llama_cpp(model: str | None, exact_llm: Any, ids: list[int], quants: list[str]) -> None:
    """The accuracy command's tables with --llama-cpp (see ``accuracy``); ``exact_llm`` is the file's
    weights dequantized to fp32."""
    import torch

    from torchburn_llm import accuracy as acc
    from torchburn_llm import default_model_path, llamacpp_peer

    path = Path(model) if model else default_model_path()
    print(f"torchburn kernels: {_isa_level()}; {llamacpp_peer.system_info()}")
    threads, count = torch.get_num_threads(), len(ids) - 1
    prompt = llamacpp_peer.teacher_forced_logits(path, ids[:-1], threads)  # [count, V]
    # llama.cpp's one-token path against its own prompt path: how far two computations of the
    # same file drift when only their rounding differs, the floor for reading the rows below
    decode = llamacpp_peer.teacher_forced_logits(path, ids[:-1], threads, chunk=1)
    stable = acc.self_agreement(prompt, decode, count)
    exact = acc.teacher_forced_logits(exact_llm, ids, "prefill")
    logits = [("llama.cpp", "prefill", prompt), ("llama.cpp", "decode", decode)]
    for q in quants:
        candidate = _load(model, q, "cpu")
        logits += [(q, p, acc.teacher_forced_logits(candidate, ids, p)) for p in acc.PATHS]
    print(acc.HEADER)
    for q, p, got in logits[1:]:
        print(acc.compare_logits(prompt, got, ids, q, p, "llama.cpp", None if q == "llama.cpp" else stable).row())
    print("\nAgainst the exact computation of the same file (weights dequantized to fp32, fp32 throughout):")
    print(acc.HEADER)
    for q, p, got in logits:
        print(acc.compare_logits(exact, got, ids, q, p, "exact fp32").row())


def _isa_level() -> str:
    """The instruction set the native kernels run (TORCHBURN_ISA may force a lower one)."""
    from torchburn_native import isa

    return isa()


def info() -> None:
    """Engines, the CPU's SIMD level and thread counts."""
    import torch

    import torchburn

    print(f"torchburn {torchburn.__version__}, torch {torch.__version__}, {torch.get_num_threads()} torch threads")
    for e in torchburn.list_engines():
        print(f"  {e}")
    try:
        import torchburn_native

        status = torchburn_native.isa_status()
        forced = f" (TORCHBURN_ISA={status['requested']})" if status["level"] != status["detected"] else ""
        print(
            f"native engine: ISA {status['level']}{forced}, {torchburn_native.num_threads()} threads, "
            f"pool {torchburn_native.thread_pool()}, GEMM on {torchburn_native.gemm_backend()}"
        )
        print(f"  CPU's level {status['detected']}; TORCHBURN_ISA may be one of: {', '.join(status['supported'])}")
        if status["ignored"]:
            print(f"  ignored: {status['ignored']}")
    except ImportError:
        from torchburn.install_hint import install_hint

        print(f"native engine: not installed ({install_hint()})")


def ops(engine: Annotated[str | None, typer.Option(help="Engine name [default: the active engine]")] = None) -> None:
    """The op coverage table of an engine, from its registry."""
    import torchburn

    print(torchburn.format_engine_ops(engine))


@cache_app.command("info")
@_unix
def cache_info() -> None:
    """Counters and the size of the on-disk cache."""
    import torchburn

    for k, v in torchburn.cache_info().items():
        print(f"{k}: {v}")


@cache_app.command("clear")
@_unix
def cache_clear() -> None:
    """Delete every cached program (memory and disk)."""
    import torchburn

    torchburn.clear_cache()
    print("cache cleared")


for command in (generate, chat, benchmark, accuracy, pull, serve):
    app.command()(_unix(command))
    llm_app.command()(_unix(command))
for group in (app, llm_app):
    group.command("list")(_unix(list_models))
    group.command()(_unix(rm))
app.command()(_unix(info))
app.command("bench-serve")(_unix(bench_serve))
app.command()(_unix(ops))


def _run(typer_app: typer.Typer) -> None:
    from rich.markup import escape

    from torchburn.errors import TorchBurnError

    try:
        # without standalone mode typer turns Ctrl-C into a returned 130 rather than an exit
        status = typer_app(standalone_mode=False)
    except StdoutClosed:
        _stdout_closed()
    except (TorchBurnError, ValueError, OSError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)  # one line, however long
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if _is_usage_error(exc):
            exc.show()  # type: ignore[attr-defined]
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        raise
    if isinstance(status, int) and status:
        sys.exit(status)


def _stdout_closed() -> NoReturn:
    """Exit quietly, as a tool killed by SIGPIPE would: stdout is pointed at /dev/null first, so that
    the interpreter's last flush of what is still buffered has nowhere to fail ("Exception ignored")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no stdout file descriptor at all: nothing left to flush either
        pass
    sys.exit(EXIT_STDOUT_CLOSED)


def _is_usage_error(exc: Exception) -> bool:
    """A mistyped command or option, from click or from the copy of click that newer typer ships."""
    import click

    usage_errors: tuple[type[Exception], ...] = (click.ClickException,)
    typer_exception = getattr(typer, "TyperException", None)
    if isinstance(typer_exception, type):
        usage_errors += (typer_exception,)
    return isinstance(exc, usage_errors) and hasattr(exc, "show")


def main() -> None:
    _run(app)


def llm_main() -> None:
    _run(llm_app)
