"""The ``torchburn`` command end to end, in subprocesses as users run it (the chat in a pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1", "COLUMNS": "120"}


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    code = "from torchburn_cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env or ENV, timeout=timeout
    )


def test_help_lists_every_command() -> None:
    out = _cli("--help")
    assert out.returncode == 0
    for command in ("generate", "chat", "benchmark", "info", "ops", "cache"):
        assert command in out.stdout
    for command in ("generate", "chat", "benchmark"):
        sub = _cli(command, "--help")
        assert sub.returncode == 0 and "--model" in sub.stdout and "--quant" in sub.stdout and "--device" in sub.stdout


def test_python_m_torchburn_llm_runs_the_llm_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "torchburn.llm", "--help"], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0 and "generate" in out.stdout and "benchmark" in out.stdout


def test_generate_with_the_embedded_model() -> None:
    out = _cli("generate", "What is the capital of France?", "-n", "16", "--no-stream")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("generate", "hi", "--model", "/no/such/model.gguf"), "/no/such/model.gguf is not a file"),
        (("generate", "hi", "--quant", "int3"), "quant='int3' is not available; choose one of"),
        (("generate", "hi", "--device", "tpu"), "device='tpu' is not available"),
        (("bench",), "No such command 'bench'. Did you mean 'benchmark', 'bench-serve'?"),
        (("generate", "hi", "--bogus"), "No such option: --bogus"),
    ],
)
def test_user_mistakes_are_one_line_errors(args: tuple[str, ...], message: str) -> None:
    out = _cli(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr


def test_info_ops_and_cache(tmp_path: Path) -> None:
    env = {**ENV, "TORCHBURN_CACHE_DIR": str(tmp_path)}
    info = _cli("info", env=env)
    assert info.returncode == 0 and "native" in info.stdout and "ISA" in info.stdout
    ops = _cli("ops", "--engine", "native", env=env)
    assert ops.returncode == 0 and "aten.addmm.default" in ops.stdout
    cache = _cli("cache", "info", env=env)
    assert cache.returncode == 0 and f"disk_dir: {tmp_path}" in cache.stdout
    assert _cli("cache", "clear", env=env).returncode == 0


def test_cache_clear_stays_inside_the_cache_dir(tmp_path: Path) -> None:
    """A folder of the cache dir that is a symlink out of it: ``cache clear`` deletes nothing through it."""
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    bait = [outside / ("ab" * 32 + ".tbp"), outside / ".0123456789abcdef.x1.tmp"]
    for path in bait:
        path.write_text("keep me")
    for layout in ("v1", "v2"):  # the previous entry format's folder, and the current one's
        engine = cache / layout / "reference"
        engine.mkdir(parents=True)
        (engine / "ab").symlink_to(outside, target_is_directory=True)
    out = _cli("cache", "clear", env={**ENV, "TORCHBURN_CACHE_DIR": str(cache)})
    assert out.returncode == 0, out.stderr
    assert all(path.read_text() == "keep me" for path in bait)


def _read_until(fd: int, marker: str, timeout: float) -> str:
    seen = ""
    end = time.monotonic() + timeout
    while marker not in seen:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {marker!r} within {timeout} s; got {seen!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk.decode("utf-8", "replace")
    return seen


def test_interactive_chat_in_a_terminal() -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, with the terminal as its stdin and stdout
        os.execve(
            sys.executable,
            [sys.executable, "-c", "from torchburn_cli.app import main; main()", "chat", "-n", "12"],
            ENV,
        )
    try:
        _read_until(fd, ">>> ", 300)
        os.write(fd, b"What is the capital of France?\n")
        answer = _read_until(fd, ">>> ", 120)
        assert "Paris" in answer
        os.write(fd, b"And of Italy?\n")
        second = _read_until(fd, ">>> ", 120)
        assert "Rome" in second  # the second turn sees the first
        os.write(fd, b"/exit\n")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.close(fd)
