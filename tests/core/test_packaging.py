"""The installed distributions carry the entry points and extras the install contract promises."""

from __future__ import annotations

import importlib.metadata as md

from packaging.requirements import Requirement


def test_core_registers_backend_and_reference_engine() -> None:
    eps = md.distribution("torchburn-core").entry_points
    backend = {ep.name: ep.value for ep in eps if ep.group == "torch_dynamo_backends"}
    engines = {ep.name: ep.value for ep in eps if ep.group == "torchburn"}
    assert backend == {"torchburn": "torchburn.backend:torchburn_backend"}
    assert engines == {"reference": "torchburn.engines.reference"}


def test_meta_package_pulls_core_and_offers_extras() -> None:
    dist = md.distribution("torchburn")
    reqs = [Requirement(r) for r in dist.requires or []]
    plain = {r.name for r in reqs if r.marker is None}
    assert "torchburn-core" in plain
    extras = {r.name: str(r.marker) for r in reqs if r.marker is not None}
    assert {"torchburn-wgpu", "torchburn-llm", "torchburn-cli"} <= set(extras)
    assert set(dist.metadata.get_all("Provides-Extra") or []) == {"wgpu", "llm", "cli", "all"}
