"""``org/name:QUANT`` picks a GGUF repo's file by the tag in its name, as llama.cpp's ``-hf`` and ollama do;
split models go as all their parts; a part of one is refused at load time with the way to merge it."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchburn_llm import LLM, ModelLoadError
from torchburn_llm.gguf_quants import gguf_models, pick, quant_tag
from torchburn_llm.hub import split_ref

FILES = [
    "README.md",
    "config.json",
    "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
    "Llama-3.2-1B-Instruct-Q4_K_S.gguf",
    "llama-3.2-1b-instruct.q8_0.gguf",
    "Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf",
    "Llama-3.2-1B-Instruct-BF16.gguf",
    "Llama-3.2-1B-Instruct-IQ4_XS.gguf",
    "mmproj-F16.gguf",  # a vision projector: not a model to run
    "Q6_K/Llama-3.2-1B-Instruct-Q6_K-00002-of-00002.gguf",
    "Q6_K/Llama-3.2-1B-Instruct-Q6_K-00001-of-00002.gguf",
]


@pytest.mark.parametrize(
    ("name", "tag"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("llama-3.2-1b-instruct.q8_0.gguf", "Q8_0"),
        ("qwen2.5-0.5b-instruct-fp16.gguf", "FP16"),
        ("gemma-3-4b-it-qat-q4_0.gguf", "Q4_0"),
        ("Qwen3-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Q8_0/Qwen3-8B-Q8_0-00001-of-00003.gguf", "Q8_0"),
        ("model-BF16.gguf", "BF16"),
        ("model-tq1_0.gguf", "TQ1_0"),
        ("model.gguf", "model"),  # no tag: the file's own name stands in
    ],
)
def test_quant_tag_from_file_names(name: str, tag: str) -> None:
    assert quant_tag(name) == tag


def test_models_group_split_parts_and_skip_projectors() -> None:
    models = {m.label: m for m in gguf_models(FILES)}
    assert sorted(models) == ["BF16", "IQ4_XS", "Q4_K_M", "Q4_K_S", "Q6_K", "Q8_0", "UD-Q4_K_XL"]
    assert models["Q6_K"].files == (
        "Q6_K/Llama-3.2-1B-Instruct-Q6_K-00001-of-00002.gguf",
        "Q6_K/Llama-3.2-1B-Instruct-Q6_K-00002-of-00002.gguf",
    )
    assert models["Q6_K"].split and not models["Q4_K_M"].split


@pytest.mark.parametrize(
    ("quant", "file"),
    [
        (None, "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),  # the default pick
        ("q4_k_m", "Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
        ("Q4_K_S", "Llama-3.2-1B-Instruct-Q4_K_S.gguf"),
        ("Q8_0", "llama-3.2-1b-instruct.q8_0.gguf"),
        ("bf16", "Llama-3.2-1B-Instruct-BF16.gguf"),
        ("UD-Q4_K_XL", "Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf"),
        ("Q4_K_XL", "Llama-3.2-1B-Instruct-UD-Q4_K_XL.gguf"),  # the tag between separators of the name
        ("q6_k", "Q6_K/Llama-3.2-1B-Instruct-Q6_K-00001-of-00002.gguf"),
    ],
)
def test_pick_by_tag_case_insensitive(quant: str | None, file: str) -> None:
    assert pick(gguf_models(FILES), quant, "acme/llama").files[0] == file


def test_pick_errors_list_what_there_is() -> None:
    models = gguf_models(FILES)
    with pytest.raises(ModelLoadError) as unknown:
        pick(models, "Q4_K", "acme/llama")  # a prefix of Q4_K_M and Q4_K_S, not a tag of its own
    assert str(unknown.value) == (
        "acme/llama has no GGUF quant 'Q4_K'; available: BF16, IQ4_XS, Q4_K_M, Q4_K_S, Q6_K, Q8_0, UD-Q4_K_XL"
    )
    no_default = gguf_models(["m-Q8_0.gguf", "m-Q5_K_M.gguf"])
    with pytest.raises(ModelLoadError, match=r"several GGUF quants: pick one as acme/m:QUANT from Q5_K_M, Q8_0"):
        pick(no_default, None, "acme/m")
    assert pick(gguf_models(["only-Q5_K_S.gguf"]), None, "acme/m").label == "Q5_K_S"  # the only one
    with pytest.raises(ModelLoadError, match=r"acme/m has no \.gguf files"):
        pick([], None, "acme/m")


def test_same_tag_in_two_files_goes_by_file_name() -> None:
    models = gguf_models(["m-7b-Q4_K_M.gguf", "m-13b-Q4_K_M.gguf"])
    assert [m.label for m in models] == ["m-13b-Q4_K_M", "m-7b-Q4_K_M"]
    assert pick(models, "m-7b-q4_k_m", "acme/m").files == ("m-7b-Q4_K_M.gguf",)
    with pytest.raises(ModelLoadError, match="names several GGUF files: m-13b-Q4_K_M, m-7b-Q4_K_M"):
        pick(models, "Q4_K_M", "acme/m")


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [("acme/m", ("acme/m", None)), ("acme/m-GGUF:Q4_K_M", ("acme/m-GGUF", "Q4_K_M"))],
)
def test_split_ref(ref: str, parsed: tuple[str, str | None]) -> None:
    assert split_ref(ref) == parsed


@pytest.mark.parametrize("ref", ["acme/m:", "acme", "/abs/m:Q4_K_M", "a/b/c:Q8_0"])
def test_split_ref_rejects_what_is_not_a_hub_model(ref: str) -> None:
    with pytest.raises(ValueError, match="is not a Hub model: write ORG/NAME, or ORG/NAME:QUANT"):
        split_ref(ref)


def test_a_part_of_a_split_gguf_is_refused_with_the_merge_command(tmp_path: Path) -> None:
    part = tmp_path / "model-Q8_0-00002-of-00003.gguf"
    part.write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError) as exc:
        LLM.from_pretrained(part)
    assert str(exc.value) == (
        f"{part} is part 2 of a GGUF model split into 3 files, and split GGUF files cannot be loaded yet: merge "
        f"them with llama.cpp's `llama-gguf-split --merge {tmp_path / 'model-Q8_0-00001-of-00003.gguf'} merged.gguf` "
        "and load merged.gguf"
    )
