"""Every WGSL kernel file compiles on the adapter, and the loader refuses bad fills."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from torchburn_wgpu import shaders


def test_every_family_has_a_sample() -> None:
    assert set(shaders.families()) == set(shaders.SAMPLES)


def _compiles(code: str) -> None:
    from torchburn_wgpu.device import gpu

    device = gpu().device
    module = device.create_shader_module(code=code)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    assert pipeline.get_bind_group_layout(0) is not None


@pytest.mark.parametrize("family", shaders.families())
def test_shader_compiles(family: str, gpu_compile: Callable[..., Any]) -> None:
    fills = dict(shaders.SAMPLES[family])
    if family in shaders.ROW_TREE_FAMILIES:
        fills.update(shaders.row_tree(False))
    _compiles(shaders.source(family, **fills))


@pytest.mark.parametrize("family", shaders.ROW_TREE_FAMILIES)
def test_subgroup_row_folds_compile(family: str, gpu_compile: Callable[..., Any]) -> None:
    """The subgroup variant of the row folds compiles where the device uses it (lavapipe has subgroups
    of 8 in order: CI runs this and every softmax and layer-norm test on that variant)."""
    import os

    from torchburn_wgpu.device import SUBGROUPS_ENV, gpu

    device = gpu()
    if os.environ.get(SUBGROUPS_ENV) == "0" or "subgroup" not in device.adapter.features:
        pytest.skip(f"subgroups are off or absent on {device.name}")
    if not device.subgroups:
        pytest.fail(f"{device.name} has subgroups but the probe found them out of order")
    _compiles(shaders.source(family, **shaders.SAMPLES[family], **shaders.row_tree(True)))


def test_missing_and_unknown_placeholders_are_errors() -> None:
    fills = dict(shaders.SAMPLES["reduce"])
    del fills["COMBINE"]
    with pytest.raises(ValueError, match=r"missing placeholders \['COMBINE'\]"):
        shaders.source("reduce", **fills)
    with pytest.raises(ValueError, match=r"unknown ones \['BOGUS'\]"):
        shaders.source("softmax", **shaders.SAMPLES["softmax"], **shaders.row_tree(False), BOGUS="1")
    with pytest.raises(ValueError, match="no WGSL kernel family 'nope'"):
        shaders.source("nope")
