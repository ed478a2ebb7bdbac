"""Reference grouped (mixture-of-experts) block-scaled GEMMs: each expert's rows through the reference
`scaled_mm` with that expert's weight, which is the contract every grouped kernel is held to.

Expert weights are stacked, b [E, N, K] with b_scale [E, ceil(N/Bn), ceil(K/Bk)]. The row counts are
read to the host here (the oracle may synchronize; the GPU kernels never do). Rows that no expert
computes (outside offsets[0]:offsets[E], or past masked_m[e]) are zeros here, scales included; the
kernels leave them unwritten.
"""

from __future__ import annotations

import math

import torch

from .gemm import scaled_mm


def _outputs(lead: tuple[int, ...], N: int, out_dtype, out_quant, out_group, device):
    """Zeroed results [*lead, N] (and [*lead, ceil(N/out_group)] fp32 scales when re-quantized)."""
    if out_quant is None:
        return torch.zeros((*lead, N), dtype=out_dtype, device=device), None
    return (torch.zeros((*lead, N), dtype=out_quant, device=device),
            torch.zeros((*lead, math.ceil(N / out_group)), dtype=torch.float32, device=device))


def _expert(out, out_scale, rows, a, a_scale, b, b_scale, bias, e, **options):
    """Write scaled_mm of expert e's rows `a`, `a_scale` into out[rows] (and out_scale[rows])."""
    if a.shape[0] == 0:
        return
    got = scaled_mm(a, a_scale, b[e], b_scale[e], bias=None if bias is None else bias[e], **options)
    if out_scale is None:
        out[rows] = got
    else:
        out[rows], out_scale[rows] = got


@torch.no_grad()
def grouped_mm(a, a_scale, b, b_scale, expert_offsets, *, block_n, block_k, bias, activation, out_dtype, out_quant,
               out_group, ue8m0_out, eps, profile=None):
    """Contiguous layout: a [M, K] fp8_e4m3fn/int8 with rows sorted by expert, a_scale [M, ceil(K/Bk)] fp32,
    b [E, N, K] (a's dtype), b_scale [E, ceil(N/Bn), ceil(K/Bk)] fp32, expert_offsets int32 [E + 1] (rows of
    expert e are offsets[e]:offsets[e+1], non-decreasing), bias [E, N] float or None. Returns out [M, N]
    out_dtype, or (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32); the options are scaled_mm's."""
    options = dict(block_n=block_n, block_k=block_k, activation=activation, out_dtype=out_dtype, out_quant=out_quant,
                   out_group=out_group, ue8m0_out=ue8m0_out, eps=eps)
    offsets = expert_offsets.tolist()
    out, out_scale = _outputs((a.shape[0],), b.shape[1], out_dtype, out_quant, out_group, a.device)
    for e in range(b.shape[0]):
        rows = slice(offsets[e], offsets[e + 1])
        _expert(out, out_scale, rows, a[rows], a_scale[rows], b, b_scale, bias, e, **options)
    return out if out_scale is None else (out, out_scale)


@torch.no_grad()
def grouped_mm_masked(a, a_scale, b, b_scale, masked_m, *, block_n, block_k, bias, activation, out_dtype, out_quant,
                      out_group, ue8m0_out, eps, profile=None):
    """Masked layout: a [E, max_m, K] fp8_e4m3fn/int8, a_scale [E, max_m, ceil(K/Bk)] fp32, masked_m int32 [E]
    (expert e's rows are a[e, :masked_m[e]], the count clamped to 0..max_m), the rest as `grouped_mm`.
    Returns out [E, max_m, N] out_dtype, or (q [E, max_m, N], scale [E, max_m, ceil(N/out_group)] fp32)."""
    options = dict(block_n=block_n, block_k=block_k, activation=activation, out_dtype=out_dtype, out_quant=out_quant,
                   out_group=out_group, ue8m0_out=ue8m0_out, eps=eps)
    E, max_m = a.shape[:2]
    out, out_scale = _outputs((E, max_m), b.shape[1], out_dtype, out_quant, out_group, a.device)
    for e, count in enumerate(masked_m.tolist()):
        rows = slice(0, max(0, min(count, max_m)))
        _expert(out[e], None if out_scale is None else out_scale[e], rows, a[e, rows], a_scale[e, rows], b, b_scale,
                bias, e, **options)
    return out if out_scale is None else (out, out_scale)
