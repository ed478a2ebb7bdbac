"""Reference fused epilogues: dequant + bias (seed 002) and quantized GELU (seed 001)."""

from __future__ import annotations

import torch

from .activation import activate
from .quant import act_dequant, act_quant


@torch.no_grad()
def dequant_bias(g, scale_a, scale_b, bias, *, out_dtype, profile=None):
    """g [M, N] (bf16/fp16/fp32/int32) -> fp32(g) * sa[m] * sb[n] + bias[n], cast to out_dtype."""
    out = g.float() * scale_a.float()[:, None] * scale_b.float()[None, :]
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


@torch.no_grad()
def quantized_gelu(q, scale, *, group_size, approximate, out_qdtype, ue8m0, eps, profile=None):
    """q [M, K], scale [M, KB] -> GELU of the dequantized values, re-quantized per 1×group_size."""
    x = act_dequant(q, scale, group_size=group_size, out_dtype=torch.float32)
    y = activate(x, "gelu_tanh" if approximate == "tanh" else "gelu")
    return act_quant(y, qdtype=out_qdtype, group_size=group_size, ue8m0=ue8m0, eps=eps, scale_m_major=False)
