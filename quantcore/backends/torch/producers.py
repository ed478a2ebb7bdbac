"""Reference fused producers: RMSNorm (with the residual add) and SiLU-and-multiply, each followed by the
reference act_quant. The unfused float functions `rms_norm` and `silu_mul` are the contract's
(docs/numerics.md, "Fused producers"): the GPU kernels compute act_quant of exactly these values.

The mean of squares is summed in one fixed order that a kernel can follow without a reduction of its
own choosing: the row's squares, padded with zeros to a power of two, added in adjacent pairs level by
level (`pairwise_sum`). Zeros added to non-negative sums are exact, so any power of two at least the
row's length gives the same sum; a kernel may pad further (a CTA's width) without changing a bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .activation import activate
from .quant import act_quant


def pairwise_sum(t: torch.Tensor) -> torch.Tensor:
    """Σ over the last dim of non-negative fp32 `t` [..., n] -> [...]: zero-padded to the next power of two,
    then level by level t[2i] + t[2i + 1] (a complete binary tree over the elements in order)."""
    n = t.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width > n:
        t = F.pad(t, (0, width - n))
    while t.shape[-1] > 1:
        t = t[..., 0::2] + t[..., 1::2]
    return t[..., 0]


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    # A 0-dim tensor on the operand's device: on CUDA torch divides by a Python scalar as a multiply by
    # its reciprocal, not with IEEE division, and the contract's constants are fp32 values.
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def sqrt_rn(t: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of fp32 `t` (IEEE's, as CUDA's sqrtf and Triton's sqrt_rn give it):
    torch's fp32 sqrt on the CPU is not (torch 2.13: 13.598342895507812 for sqrt(184.91494750976562),
    whose nearest fp32 is 13.598343849182129). From a double square root rounded to fp32, within an ulp of
    the answer, the candidate is moved to its neighbour where t lies beyond the midpoint between them,
    compared exactly in float64 (a midpoint has 25 significant bits, its square at most 50; no fp32 t is
    ever a midpoint's square, so there are no ties)."""
    r = torch.sqrt(t.double()).float()
    t64, r64 = t.double(), r.double()
    up, down = torch.nextafter(r, torch.full_like(r, float("inf"))), torch.nextafter(r, torch.zeros_like(r))
    r = torch.where(t64 >= ((r64 + up.double()) / 2).square(), up, r)
    return torch.where(t64 < ((r64 + down.double()) / 2).square(), down, r)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, eps: float):
    """The contract's RMSNorm, unquantized: x [M, H] bf16/fp16/fp32, weight [H], residual [M, H] of x's dtype or
    None -> (y [M, H] in torch.promote_types(x.dtype, weight.dtype), new_residual [M, H] x's dtype or None).

    new_residual = x + residual rounded to x's dtype (one fp32 add, then the cast), and the norm reads it;
    ms = pairwise_sum(v·v) / H, rstd = 1 / sqrt(ms + fp32(eps)) (IEEE square root and division),
    y = weight · (v·rstd rounded to x's dtype), rounded to the promoted dtype: where Llama's RMSNorm and
    torch's rms_norm round, and nowhere else."""
    H = x.shape[-1]
    new_residual = None
    if residual is not None:
        new_residual = (x.float() + residual.float()).to(x.dtype)
        x = new_residual
    v = x.float()
    mean_square = pairwise_sum(v * v) / _f32(H, v)
    rstd = torch.ones_like(mean_square) / sqrt_rn(mean_square + _f32(eps, v))
    normed = (v * rstd[:, None]).to(x.dtype)
    y = (weight.float() * normed.float()).to(torch.promote_types(x.dtype, weight.dtype))
    return y, new_residual


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] bf16/fp16/fp32 -> silu(gate)·up [M, I] in fp32: SiLU in the contract's form
    (`activation.activate`) and the product in fp32, neither rounded to the input's dtype."""
    half = gate_up.shape[-1] // 2
    return activate(gate_up[:, :half].float(), "silu") * gate_up[:, half:].float()


@torch.no_grad()
def rms_norm_quant(x, weight, residual, *, eps, qdtype, group_size, ue8m0, quant_eps, scale_m_major, profile=None):
    """x [M, H], weight [H], residual [M, H] or None -> act_quant(rms_norm(...)): (q [M, H] qdtype, scale
    [M, ceil(H/G)] fp32), and new_residual [M, H] x's dtype after them when a residual is given."""
    y, new_residual = rms_norm(x, weight, residual, eps)
    q, scale = act_quant(y, qdtype=qdtype, group_size=group_size, ue8m0=ue8m0, eps=quant_eps,
                         scale_m_major=scale_m_major)
    return (q, scale) if new_residual is None else (q, scale, new_residual)


@torch.no_grad()
def silu_mul_quant(gate_up, masked_m, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile=None):
    """gate_up [M, 2I] -> act_quant(silu_mul(gate_up)): (q [M, I] qdtype, scale [M, ceil(I/G)] fp32). With
    masked_m (gate_up the [E·max_m, 2I] rows of [E, max_m, 2I]) every row is computed: the contract leaves
    the rows past an expert's count unspecified."""
    return act_quant(silu_mul(gate_up), qdtype=qdtype, group_size=group_size, ue8m0=ue8m0, eps=eps,
                     scale_m_major=scale_m_major)
