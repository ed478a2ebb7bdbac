"""Reference quantize / dequantize in plain torch: the oracle every other backend is compared to.

Blocks are formed by zero-padding to whole blocks and reshaping; padding never changes a block's
amax (|0| <= any amax) and is cut away before returning.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...formats import format_of_dtype

_EXP_MASK = 0x7F800000
_MANT_MASK = 0x007FFFFF


def round_scale_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Round fp32 scales up to a normal power of two on their bits: 2^max(ceil(log2 s), -126), a
    subnormal scale becoming 2^-126 (docs/numerics.md says why); NaN/Inf pass through unchanged."""
    bits = scale.view(torch.int32)
    needs_up = ((bits & _MANT_MASK) != 0) & ((bits & _EXP_MASK) != _EXP_MASK)
    rounded = (bits & ~_MANT_MASK) + (1 << 23)
    return torch.where(needs_up, rounded, bits).view(torch.float32)


def block_scale(amax: torch.Tensor, qdtype: torch.dtype, ue8m0: bool, eps: float) -> torch.Tensor:
    """scale = max(amax, fp32(eps)) / qmax in fp32 (NaN amax stays NaN), optionally ue8m0-rounded."""
    floor = torch.tensor(eps, dtype=torch.float32, device=amax.device)
    # A tensor divisor, not a Python float: on CUDA, torch divides by a scalar as a multiply by its
    # reciprocal, which is not IEEE division and differs in the last bit for many amax values.
    qmax = torch.tensor(format_of_dtype(qdtype).qmax, dtype=torch.float32, device=amax.device)
    scale = torch.maximum(amax.float(), floor) / qmax
    return round_scale_ue8m0(scale) if ue8m0 else scale


def encode(v: torch.Tensor, qdtype: torch.dtype) -> torch.Tensor:
    """fp32 quotients -> qdtype: FP8 saturates to ±448 then rounds to nearest even (NaN stays NaN);
    INT8 rounds half to even, clamps to ±127, and maps NaN to 0."""
    qmax = format_of_dtype(qdtype).qmax
    if qdtype == torch.int8:
        return torch.nan_to_num(torch.round(v).clamp(-qmax, qmax), nan=0.0).to(torch.int8)
    return v.clamp(-qmax, qmax).to(qdtype)


def _pad_last(t: torch.Tensor, block: int) -> torch.Tensor:
    pad = -t.shape[-1] % block
    return F.pad(t, (0, pad)) if pad else t


def _amax_blocks(xb: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    # torch.amax propagates NaN, which the contract wants (a NaN block gets a NaN scale).
    return xb.abs().amax(dim=dims)


@torch.no_grad()
def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile=None):
    """x [M, K] float -> (q [M, K] qdtype, scale [M, ceil(K/G)] fp32); see the backend contract."""
    M, K = x.shape
    kb = math.ceil(K / group_size)
    xb = _pad_last(x.float(), group_size).reshape(M, kb, group_size)
    scale = block_scale(_amax_blocks(xb, (2,)), qdtype, ue8m0, eps)
    q = encode(xb / scale.unsqueeze(-1), qdtype).reshape(M, kb * group_size)[:, :K].contiguous()
    return q, (scale.t().contiguous().t() if scale_m_major else scale)


def dequantize(q: torch.Tensor, scale: torch.Tensor, rows: int, block_k: int, out_dtype: torch.dtype) -> torch.Tensor:
    """q [R, K] fp8/int8 with scale [ceil(R/rows), ceil(K/block_k)] fp32 (any strides) -> fp32(q)·scale
    rounded once to out_dtype, [R, K] contiguous: per 1×block_k group for rows=1, per block otherwise."""
    R, K = q.shape
    s = scale.float() if rows == 1 else scale.float().repeat_interleave(rows, 0)[:R]  # [R, KB]
    # Every e4m3 and int8 code is exact in bf16, fp16 and fp32, so the codes are widened straight to
    # out_dtype; the multiply by the fp32 scale promotes to fp32 and rounds once as it is stored: two
    # passes over memory instead of an fp32 copy, a product and a cast.
    x = q.to(out_dtype, memory_format=torch.contiguous_format)
    out = torch.empty_like(x)
    whole, cut = K // block_k, K - K % block_k
    if whole:
        torch.mul(x[:, :cut].unflatten(1, (whole, block_k)), s[:, :whole, None],
                  out=out[:, :cut].unflatten(1, (whole, block_k)))
    if cut < K:
        torch.mul(x[:, cut:], s[:, whole:], out=out[:, cut:])
    return out


@torch.no_grad()
def act_dequant(q, scale, *, group_size, out_dtype, profile=None):
    """q [M, K], scale [M, KB] -> fp32(q) * scale cast to out_dtype, [M, K]."""
    return dequantize(q, scale, 1, group_size, out_dtype)


def weight_blocks(t: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """t [N, K] zero-padded to whole blocks as [ceil(N/Bn), Bn, ceil(K/Bk), Bk]."""
    N, K = t.shape
    padded = F.pad(t, (0, -K % block_k, 0, -N % block_n))
    return padded.reshape(math.ceil(N / block_n), block_n, math.ceil(K / block_k), block_k)


@torch.no_grad()
def weight_quant(w, *, qdtype, block_n, block_k, ue8m0, eps, profile=None):
    """w [N, K] float -> (q [N, K] qdtype, scale [ceil(N/Bn), ceil(K/Bk)] fp32)."""
    N, K = w.shape
    wb = weight_blocks(w.float(), block_n, block_k)
    scale = block_scale(_amax_blocks(wb, (1, 3)), qdtype, ue8m0, eps)
    q = encode(wb / scale[:, None, :, None], qdtype)
    return q.reshape(q.shape[0] * block_n, -1)[:N, :K].contiguous(), scale


@torch.no_grad()
def weight_dequant(q, scale, *, block_n, block_k, out_dtype, profile=None):
    """q [N, K], scale [NB, KB] -> fp32(q) * scale cast to out_dtype, [N, K]."""
    return dequantize(q, scale, block_n, block_k, out_dtype)
