"""Test helpers: random inputs."""

from __future__ import annotations

import torch


def randn(shape, dtype=torch.float32, gen=None, scale=1.0, device="cpu"):
    """Random normal values with per-row spread, so blocks get different scales."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    if len(shape) >= 1 and x.numel():
        x = x * torch.exp(torch.randn(*shape[:-1], 1, generator=gen)) * scale
    return x.to(dtype).to(device)
