"""The pieces of the llama.cpp comparisons that run without llama.cpp: the accuracy comparison against
logits computed elsewhere, the random-weight files the speed comparisons use, and the message when the
extra is missing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from torchburn_llm import LLM, bench_files, llamacpp_peer
from torchburn_llm import accuracy as acc
from torchburn_llm.errors import PeerUnavailableError


def test_comparison_against_given_logits_counts_agreement_and_perplexity(smollm2: LLM) -> None:
    ids = smollm2.encode(acc.evaluation_text())[:300]
    model = smollm2.model
    logits = model.forward(torch.tensor(ids[:-1]), model.new_cache(len(ids)))  # [299, V]
    same = acc.compare(logits, smollm2, ids, "prefill", "given")
    assert same.reference == "given" and same.tokens == 299
    assert same.top1_agreement == 1.0 and abs(same.perplexity_change) < 1e-4, same.row()
    # a reference that flips its choice at every third position, by hand
    flipped = logits.clone()
    rows = torch.arange(0, 299, 3)
    flipped[rows, logits[rows].argmin(-1)] = logits[rows].max(-1).values + 1.0
    got = acc.compare(flipped, smollm2, ids, "prefill", "given")
    assert got.top1_agreement == pytest.approx(1 - len(rows) / 299)
    # every miss is a flipped row, where the reference leads its runner-up by exactly 1.0
    assert got.largest_missed_margin == pytest.approx(1.0, abs=1e-4) and same.largest_missed_margin == 0.0
    # the flipped rows marked as ones the reference does not decide: full agreement on the rest
    stable = torch.ones(299, dtype=torch.bool)
    stable[rows] = False
    decided = acc.compare(flipped, smollm2, ids, "prefill", "given", stable)
    assert (decided.stable_agreement, decided.stable_positions) == (1.0, 299 - len(rows))
    assert decided.row().endswith(f"| 1.000 | 100.00% of {299 - len(rows)} |") and got.row().endswith("| - |")
    # only the first row stable: that row is flipped too, so nothing agrees there
    first = torch.zeros(299, dtype=torch.bool)
    first[0] = True
    assert acc.compare(flipped, smollm2, ids, "prefill", "given", first).stable_agreement == 0.0
    with pytest.raises(ValueError, match="stable mask covers"):
        acc.compare(flipped, smollm2, ids, "prefill", "given", stable[:5])
    target = torch.tensor(ids[1:])
    nll = float(torch.nn.functional.cross_entropy(flipped, target))
    assert got.reference_perplexity == pytest.approx(math.exp(nll), rel=1e-5)
    with pytest.raises(ValueError, match="cover 10 positions, 299 are compared"):
        acc.compare(logits[:10], smollm2, ids, "prefill")


def test_logits_against_logits_match_the_model_comparison(smollm2: LLM) -> None:
    ids = smollm2.encode(acc.evaluation_text())[:200]
    prompt = acc.teacher_forced_logits(smollm2, ids, "prefill")  # [199, V]
    decode = acc.teacher_forced_logits(smollm2, ids, "decode")
    assert prompt.shape == decode.shape == (199, smollm2.config.vocab_size)
    row = acc.compare_logits(prompt, decode, ids, "own", "decode", "prompt")
    # the same numbers as comparing the model on its decode path against the prompt logits
    whole = acc.compare(prompt, smollm2, ids, "decode", "prompt")
    assert (row.top1_agreement, row.perplexity, row.reference_perplexity) == pytest.approx(
        (whole.top1_agreement, whole.perplexity, whole.reference_perplexity)
    )
    by_hand = float((prompt.argmax(-1) == decode.argmax(-1)).float().mean())
    assert row.top1_agreement == pytest.approx(by_hand) and row.quant == "own"
    assert int(acc.self_agreement(prompt, decode, 199).sum()) == round(by_hand * 199)
    with pytest.raises(ValueError, match="candidate logits cover 10 positions, 199 are compared"):
        acc.compare_logits(prompt, decode[:10], ids, "own", "decode", "prompt")


def test_random_llama_files_load_and_encode(tmp_path: Path) -> None:
    shape = bench_files.Shape(64, 128, 2, 4, 2, vocab=49300, tied=False, context=64)
    path = tmp_path / "random.gguf"
    bench_files.write_random(shape, path)
    llm = LLM.from_pretrained(path)
    cfg = llm.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size) == (64, 128, 2, 49300)
    assert llm.model.quant == "stored" and llm.model.lm_head.quant == "F16"
    ids = llm.encode("The history of the printing press")
    assert 0 < len(ids) < 20 and llm.tokenizer.decode(ids) == "The history of the printing press"
    logits = llm.model.forward(torch.tensor(ids), llm.model.new_cache(32))
    assert logits.shape == (len(ids), 49300) and bool(torch.isfinite(logits).all())


def test_a_missing_llama_cpp_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # importing it raises ImportError
    with pytest.raises(PeerUnavailableError, match=r"pip install 'torchburn-llm\[llama-cpp\]'"):
        llamacpp_peer.system_info()
    with pytest.raises(ValueError, match="is not one of"):
        bench_files.quantize(Path("a.gguf"), Path("b.gguf"), "Q3_K_XXL")


def test_the_accuracy_tables_against_a_stand_in_for_llama_cpp(
    smollm2: LLM, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchburn_cli import app

    ids = smollm2.encode(acc.evaluation_text())[:120]
    exact_llm = LLM.from_pretrained(None, quant="fp32")
    exact = acc.teacher_forced_logits(exact_llm, ids, "prefill")  # [119, V]
    # the stand-in's prompt path is the exact computation with every fourth choice flipped, its decode path
    # the exact computation itself
    prompt = exact.clone()
    rows = torch.arange(0, 119, 4)
    prompt[rows, exact[rows].argmin(-1)] = exact[rows].max(-1).values + 0.5

    def stand_in(path: Path, given: list[int], threads: int, chunk: int = 256) -> torch.Tensor:
        assert given == ids[:-1] and path.suffix == ".gguf"
        return prompt if chunk > 1 else exact

    monkeypatch.setattr(llamacpp_peer, "teacher_forced_logits", stand_in)
    monkeypatch.setattr(llamacpp_peer, "system_info", lambda: "stand-in")
    app._accuracy_against_llama_cpp(None, exact_llm, ids, ["stored"])
    first, second = capsys.readouterr().out.split("Against the exact computation")
    flipped = f"{100 * (1 - len(rows) / 119):.2f}%"
    # against the stand-in's prompt path: its own decode path misses exactly the flipped rows, by 0.5
    assert f"| llama.cpp | decode | llama.cpp | 119 | {flipped} |" in first and "| 0.500 | - |" in first
    # ours, counted where the stand-in agrees with itself: the rows it did not flip
    assert f"100.00% of {119 - len(rows)} |" in first
    # against the exact computation: the stand-in's decode path is it; our prefill path is it too
    assert "| llama.cpp | decode | exact fp32 | 119 | 100.00% |" in second
    assert f"| llama.cpp | prefill | exact fp32 | 119 | {flipped} |" in second
    assert "| stored | prefill | exact fp32 | 119 | 100.00% |" in second
