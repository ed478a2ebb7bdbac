"""Reference block-scaled GEMM with the spec's epilogues.

Each K block's dot product is computed in float64 (exact for INT8 and for products of FP8 values)
and rounded once to fp32, then scaled by a_s[m, kb] * b_s[n // Bn, kb] into an fp32 accumulator,
as the numerics contract defines.
"""

from __future__ import annotations

import math

import torch

from ...runtime.launch import composed_quant_linear
from .activation import activate
from .quant import act_quant


def epilogue(acc, *, bias, activation, out_dtype, out_quant, out_group, ue8m0_out, eps):
    """fp32 acc [M, N] -> + bias, activation, then a cast to out_dtype or a 1×out_group re-quantize."""
    if bias is not None:
        acc = acc + bias.float()
    acc = activate(acc, activation)
    if out_quant is None:
        return acc.to(out_dtype)
    # A group wider than N is one group per row: quantizing with N avoids padding to the requested width.
    return act_quant(acc, qdtype=out_quant, group_size=min(out_group, acc.shape[1]), ue8m0=ue8m0_out, eps=eps,
                     scale_m_major=False)


@torch.no_grad()
def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype,
              out_quant, out_group, ue8m0_out, eps, profile=None):
    """a [M, K] @ b [N, K]^T with per-(1×Bk) a scales and per-(Bn×Bk) b scales; see the contract."""
    M, K = a.shape
    N = b.shape[0]
    b_s = b_scale.float().repeat_interleave(block_n, dim=0)[:N]  # [N, KB]
    acc = torch.zeros(M, N, dtype=torch.float32, device=a.device)
    for kb in range(math.ceil(K / block_k)):
        ks = slice(kb * block_k, min(K, (kb + 1) * block_k))
        dot = (a[:, ks].double() @ b[:, ks].double().t()).float()
        acc += dot * a_scale[:, kb : kb + 1].float() * b_s[:, kb]
    return epilogue(acc, bias=bias, activation=activation, out_dtype=out_dtype, out_quant=out_quant,
                    out_group=out_group, ue8m0_out=ue8m0_out, eps=eps)


quant_linear = composed_quant_linear(act_quant, scaled_mm)
