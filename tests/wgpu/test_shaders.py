"""Every WGSL kernel file compiles on the adapter, and the loader refuses bad fills."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from torchburn_wgpu import shaders


def test_every_family_has_a_sample() -> None:
    assert set(shaders.families()) == set(shaders.SAMPLES)


@pytest.mark.parametrize("family", shaders.families())
def test_shader_compiles(family: str, gpu_compile: Callable[..., Any]) -> None:
    from torchburn_wgpu.device import gpu

    device = gpu().device
    module = device.create_shader_module(code=shaders.source(family, **shaders.SAMPLES[family]))
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    assert pipeline.get_bind_group_layout(0) is not None


def test_missing_and_unknown_placeholders_are_errors() -> None:
    fills = dict(shaders.SAMPLES["reduce"])
    del fills["COMBINE"]
    with pytest.raises(ValueError, match=r"missing placeholders \['COMBINE'\]"):
        shaders.source("reduce", **fills)
    with pytest.raises(ValueError, match=r"unknown ones \['BOGUS'\]"):
        shaders.source("softmax", **shaders.SAMPLES["softmax"], BOGUS="1")
    with pytest.raises(ValueError, match="no WGSL kernel family 'nope'"):
        shaders.source("nope")
