"""``Transformer.decode_batch``: one token of each of several sequences per call, each over its own KV
cache, against decoding each sequence alone. Sequences of different prompt lengths join and leave
between steps (a server's continuous batching); every step's logits must match the sequence's own
decode step and the greedy tokens must be the same, for the shipped GGUF model in its stored types and
requantized, and for a tiny random model of every family (grouped-query Llama; Gemma 2 with a sliding
window, logit caps and sandwich norms; Qwen3's q/k norms; Phi-3's partial rotation...) and a GGUF of
many stored types."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm.test_gguf_stored import _tiny_gguf
from llm.test_parity import FAMILIES, _tiny

from torchburn_llm import LLM
from torchburn_llm.errors import ContextLengthError
from torchburn_llm.model import KVCache, Transformer

STEPS = 16
# (join at step, steps run): two from the start to the end, one leaving half-way, one joining late
SCHEDULE = [(0, STEPS), (0, 8), (0, STEPS), (5, STEPS - 5)]


def _alone(model: Transformer, prompt: list[int], steps: int) -> tuple[torch.Tensor, list[int]]:
    """Greedy decoding of one sequence by itself: each step's logits [steps, V] and the tokens fed in
    (the prompt's next token, then each step's argmax; steps + 1 of them)."""
    cache = model.new_cache(len(prompt) + steps + 1)
    token = int(model.forward(torch.tensor(prompt), cache, last_only=True)[-1].argmax())
    rows, tokens = [], [token]
    for _ in range(steps):
        logits = model.forward(torch.tensor([token]), cache)[-1]
        token = int(logits.argmax())
        rows.append(logits)
        tokens.append(token)
    return torch.stack(rows), tokens


def _continuous_batching(model: Transformer, prompts: list[list[int]]) -> None:
    """Runs SCHEDULE with ``decode_batch`` and holds every sequence's every step to its decoding alone."""
    want = [_alone(model, p, n) for p, (_, n) in zip(prompts, SCHEDULE, strict=True)]
    caches: dict[int, KVCache] = {}
    tokens: dict[int, int] = {}
    calls = model.native_batched_steps
    for step in range(STEPS):
        for s, (join, _) in enumerate(SCHEDULE):
            if join == step:  # a new sequence: its prompt into a cache of its own
                caches[s] = model.new_cache(len(prompts[s]) + STEPS + 1)
                tokens[s] = int(model.forward(torch.tensor(prompts[s]), caches[s], last_only=True)[-1].argmax())
        active = [s for s, (join, n) in enumerate(SCHEDULE) if join <= step < join + n]
        if step % 2:
            active.reverse()  # the rows' order is the caller's
        logits = model.decode_batch([tokens[s] for s in active], [caches[s] for s in active])
        assert logits.shape == (len(active), model.cfg.vocab_size)
        for row, s in zip(logits, active, strict=True):
            i = step - SCHEDULE[s][0]
            ref_logits, ref_tokens = want[s]
            assert tokens[s] == ref_tokens[i]
            scale = float(ref_logits[i].abs().max())
            # the same kernels per row as the step alone: equal to float rounding at most
            torch.testing.assert_close(row, ref_logits[i], rtol=0, atol=1e-4 * scale, msg=f"sequence {s} step {i}")
            tokens[s] = int(row.argmax())
            assert tokens[s] == ref_tokens[i + 1], f"sequence {s} step {i}: greedy token differs"
            assert caches[s].length == len(prompts[s]) + i + 1
    if model.native_decode:
        assert model.native_batched_steps == calls + STEPS


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def shipped(smollm2_path: Path, smollm2: LLM) -> dict[str, LLM]:
    """The embedded model as stored (the default), requantized to int4 and int8, and in fp32."""
    return {
        "stored": LLM.from_pretrained(),
        "int4": LLM.from_pretrained(smollm2_path, quant="int4"),
        "int8": LLM.from_pretrained(smollm2_path, quant="int8"),
        "fp32": smollm2,
    }


@pytest.mark.parametrize("quant", ["stored", "int4", "int8", "fp32"])
def test_shipped_model_batches_match_decoding_alone(shipped: dict[str, LLM], quant: str) -> None:
    llm = shipped[quant]
    assert llm.model.quant == quant
    texts = [
        "The capital of France is",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "def fibonacci(n):",
        "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    ]
    _continuous_batching(llm.model, [llm.encode(t) for t in texts])


@pytest.mark.parametrize(
    ("family", "quant"),
    [
        *((family, quant) for family in ("llama", "gemma2") for quant in ("fp32", "int4")),
        *((family, "int8") for family in sorted(FAMILIES)),
    ],
)
def test_tiny_models_batches_match_decoding_alone(tmp_path: Path, family: str, quant: str) -> None:
    # 4 heads over 2 KV heads; Gemma 2's window of 8 cuts all but the shortest context on its
    # windowed layer, and its caps bend the scores and logits
    _, folder = _tiny(tmp_path, family, intermediate_size=96)  # quantized rows are whole blocks of 32
    model = LLM.from_pretrained(folder, quant=quant).model
    _continuous_batching(model, _prompts(model.cfg.vocab_size, [3, 11, 6, 20], seed=1))


def test_tiny_gguf_of_many_stored_types_batches_match_decoding_alone(tmp_path: Path) -> None:
    _, path = _tiny_gguf(tmp_path, "gemma2", ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_1", "Q5_K"])
    model = LLM.from_pretrained(path).model
    assert model.quant == "stored"
    _continuous_batching(model, _prompts(model.cfg.vocab_size, [5, 2, 13, 9], seed=2))


def test_tensor_path_batches_one_sequence_at_a_time(tmp_path: Path) -> None:
    _, folder = _tiny(tmp_path, "llama")
    model = LLM.from_pretrained(folder).model
    model.native_decode = False
    _continuous_batching(model, _prompts(model.cfg.vocab_size, [4, 7, 2, 9], seed=3))
    assert model.native_batched_steps == 0 and model.native_steps == 0


def test_mismatched_inputs_are_refused_and_change_nothing(tmp_path: Path) -> None:
    _, folder = _tiny(tmp_path, "llama")
    model = LLM.from_pretrained(folder).model
    vocab = model.cfg.vocab_size
    a, b, full = model.new_cache(8), model.new_cache(8), model.new_cache(2)
    for cache in (a, b, full):
        model.forward(torch.tensor([5, 6]), cache)
    with pytest.raises(ValueError, match="2 tokens for 1 KV caches"):
        model.decode_batch([1, 2], [a])
    with pytest.raises(ValueError, match="the same cache appears twice"):
        model.decode_batch([1, 2], [a, a])
    with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {vocab}\), got -1\.\.2"):
        model.decode_batch([2, -1], [a, b])
    with pytest.raises(ValueError, match=rf"got 1\.\.{vocab}"):
        model.decode_batch([1, vocab], [a, b])
    with pytest.raises(ContextLengthError, match="exceed the KV cache's 2 positions"):
        model.decode_batch([1, 2], [a, full])
    # two caches over the same memory: the native decoder refuses them
    alias = model.new_cache(8)
    alias.keys, alias.values = a.keys, a.values
    with pytest.raises(
        ValueError, match=r"needs a KV cache of its own: sequence 0's (keys|values) overlap sequence 1's"
    ):
        model.decode_batch([1, 2], [a, alias])
    assert (a.length, b.length, full.length, alias.length) == (2, 2, 2, 0)
    assert model.native_batched_steps == 0
    assert model.decode_batch([], []).shape == (0, vocab)


def test_native_step_batch_checks_every_sequence(tmp_path: Path) -> None:
    _, folder = _tiny(tmp_path, "llama")
    model = LLM.from_pretrained(folder).model
    decoder = model.native_decoder()
    vocab, width = model.cfg.vocab_size, decoder.dims.rotary_width
    caches = [model.new_cache(4), model.new_cache(6)]
    keys, values = [c.keys for c in caches], [c.values for c in caches]
    cos, sin = torch.zeros(2, width), torch.zeros(2, width)
    logits = torch.empty(2, vocab)
    with pytest.raises(ValueError, match="at least one sequence"):
        decoder.step_batch([], [], [], [], cos[:0], sin[:0], logits[:0])
    with pytest.raises(ValueError, match="2 tokens, 1 positions, 2 key caches and 2 value caches"):
        decoder.step_batch([1, 2], [0], keys, values, cos, sin, logits)
    with pytest.raises(IndexError, match=f"sequence 1: token id {vocab} is out of bounds"):
        decoder.step_batch([1, vocab], [0, 0], keys, values, cos, sin, logits)
    with pytest.raises(IndexError, match="sequence 0: position 4 is out of bounds for a KV cache of 4 positions"):
        decoder.step_batch([1, 2], [4, 0], keys, values, cos, sin, logits)
    with pytest.raises(IndexError, match="must not be negative"):
        decoder.step_batch([1, 2], [0, -1], keys, values, cos, sin, logits)
    with pytest.raises(ValueError, match=f"rotary cos rows must be a contiguous f32 CPU tensor of 2x{width}"):
        decoder.step_batch([1, 2], [0, 0], keys, values, cos[:1], sin, logits)
    with pytest.raises(ValueError, match=f"logits must be a contiguous f32 CPU tensor of 2x{vocab}"):
        decoder.step_batch([1, 2], [0, 0], keys, values, cos, sin, logits[:1])
    with pytest.raises(ValueError, match="KV cache's keys must be contiguous f32"):
        decoder.step_batch([1, 2], [0, 0], [keys[0], keys[1].double()], values, cos, sin, logits)
    with pytest.raises(ValueError, match="sequence 1's keys and values share memory"):
        decoder.step_batch([1, 2], [0, 0], keys, [values[0], keys[1]], cos, sin, logits)
    # caches that overlap in part: views of one buffer, one head_dim apart
    shape = keys[1].shape
    buffer = torch.zeros(keys[1].numel() + shape[-1])
    shifted = [buffer[: keys[1].numel()].view(shape), buffer[shape[-1] :].view(shape)]
    with pytest.raises(ValueError, match="sequence 0's keys overlap sequence 1's keys"):
        decoder.step_batch([1, 2], [0, 0], shifted, [values[1], values[1].clone()], cos, sin, logits)
