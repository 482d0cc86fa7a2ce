"""The ``torchburn`` command behaves like a Unix tool, run for real in subprocesses on a tiny random model:
Ctrl-C exits 130, a reader that goes away (``| head -c 10``) ends it quietly with 141, and a prompt that is
not UTF-8 is a one-line error with exit 2 — never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from torchburn_llm import ModelConfig, architecture_for

ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1", "COLUMNS": "60"}
CLI = [sys.executable, "-c", "from torchburn_cli.app import main; main()"]
# sampled (a random model's greedy choice may settle on a byte that never completes a character), no EOS
ENDLESS = ["-n", "100000", "--temperature", "1", "--seed", "1"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random one-layer Llama with a byte-level tokenizer, a chat template and room for 200k tokens."""
    folder = tmp_path_factory.mktemp("tiny-chat")
    raw = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 200_000,
    }
    (folder / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_dict(raw)
    gen = torch.Generator().manual_seed(0)
    shapes = architecture_for("llama").tensors(cfg)
    save_file({n: torch.randn(s, generator=gen) * 0.5 for n, s in shapes.items()}, str(folder / "model.safetensors"))
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    return folder


def _start(*args: str | bytes, stdin: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CLI, *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    """The exit status and stderr of ``proc`` (killed if it hangs)."""
    try:
        assert proc.stderr is not None
        err = proc.stderr.read().decode("utf-8", "replace")
        return proc.wait(timeout=120), err
    finally:
        if proc.poll() is None:
            proc.kill()


def _assert_quiet(err: str) -> None:
    for noise in ("Traceback", "Error", "Exception ignored", "Aborted"):
        assert noise not in err, err


def test_ctrl_c_during_generate_exits_130(tiny_model: Path) -> None:
    proc = _start("generate", "hello", "--raw", "--model", str(tiny_model), *ENDLESS)
    assert proc.stdout is not None
    assert proc.stdout.read(1)  # it is generating
    proc.send_signal(signal.SIGINT)
    status, err = _finish(proc)
    assert status == 130, err
    _assert_quiet(err)


def test_ctrl_c_during_a_chat_reply_exits_130(tiny_model: Path) -> None:
    proc = _start("chat", "--model", str(tiny_model), *ENDLESS, stdin=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.read(4) == b">>> "
    proc.stdin.write(b"hello\n")
    proc.stdin.flush()
    assert proc.stdout.read(1)  # the reply is streaming
    proc.send_signal(signal.SIGINT)
    status, err = _finish(proc)
    assert status == 130, err
    _assert_quiet(err)


def test_a_reader_that_goes_away_ends_it_quietly(tiny_model: Path) -> None:
    # what `torchburn generate ... | head -c 10` does to it
    proc = _start("generate", "hello", "--raw", "--model", str(tiny_model), *ENDLESS)
    assert proc.stdout is not None
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    status, err = _finish(proc)
    assert status == 141, err  # 128 + SIGPIPE, as the shell reports for a producer whose reader quit
    _assert_quiet(err)


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["generate", b"caf\xe9 \xff\xfe"], "the prompt"),
        (["generate", "hello", "--stop", b"\xff"], "a --stop string"),
        (["chat", "--system", b"\xfe"], "the system prompt"),
    ],
)
def test_a_prompt_that_is_not_utf8_is_a_one_line_error(tiny_model: Path, args: list[str | bytes], what: str) -> None:
    out = subprocess.run(
        [*CLI, *args, "--model", str(tiny_model)], capture_output=True, env=ENV, timeout=120, stdin=subprocess.DEVNULL
    )
    err = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 2, err
    assert err.strip().splitlines() == [err.strip()], err  # one line, however narrow the terminal
    assert err.startswith(f"error: {what} is not valid UTF-8 text:"), err
    assert "\\xff" in err or "\\xfe" in err  # the bytes are shown, escaped
