"""TorchBurn's GPU engine: torch.compile regions as WGSL kernels on Vulkan, Metal, DX12 or GL (wgpu)."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
