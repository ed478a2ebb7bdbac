"""Specs of the block-scaled GEMM `a[..., K] @ b[N, K]^T` with fused epilogues, and of the quantized
linear layer that quantizes its activation on the way in."""

from __future__ import annotations

import math

import torch

from .. import capability
from ..registry.query import m_bucket
from ..formats import ACTIVATIONS, DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, dtype_name, format_of_dtype
from . import checks
from .base import Prepared, leading
from .gemm_query import GemmQuery


def scaled_mm(a, a_scale, b, b_scale, bias=None, *, activation=None, out_dtype=torch.bfloat16, out_quant=None,
              block_size=DEFAULT_BLOCK, out_group_size=DEFAULT_GROUP, out_scale_fmt="fp32",
              eps=DEFAULT_EPS) -> Prepared:
    """Spec of `ops.scaled_mm`.

    a [..., K] and b [N, K] share one quantized dtype; a_scale [..., ceil(K/Bk)] fp32 (activations
    quantized per 1×Bk: the group must equal the weight's K block); b_scale [ceil(N/Bn), ceil(K/Bk)] fp32;
    bias [N]. Returns [..., N] out_dtype, or with `out_quant` a dtype, (q [..., N], scale [..., ceil(N/G)]).
    """
    op = "scaled_mm"
    a, fmt = checks.quantized(op, "a", a)
    b = checks.matrix(op, "b", b, (torch.float8_e4m3fn, torch.int8))
    if b.dtype != a.dtype:
        raise checks.fail(op, f"a is {dtype_name(a.dtype)} but b is {dtype_name(b.dtype)}; "
                              "both operands must have the same quantized dtype")
    a_scale = checks.tensor(op, "a_scale", a_scale, (torch.float32,))
    bn, bk = checks.block_pair(op, block_size)
    act = checks.choice(op, "activation", activation, ACTIVATIONS)
    out = checks.out_float(op, "out_dtype", out_dtype)
    lead, K = a.shape[:-1], a.shape[-1]
    N = b.shape[0]
    b_scale, bias = _weight(op, b, b_scale, bias, K, bn, bk, ("b", "b_scale"))
    kb = math.ceil(K / bk)
    if a_scale.shape[-1] != kb and a_scale.dim() == a.dim():
        raise checks.fail(op, f"a_scale has {a_scale.shape[-1]} groups per row but the weight's K block {bk} gives "
                              f"ceil({K}/{bk}) = {kb}; quantize the activation with group_size={bk}")
    checks.shape(op, "a_scale", a_scale, (*lead, kb), f"one fp32 scale per 1x{bk} group of a's rows")
    checks.same_device(op, a=a, a_scale=a_scale, b=b, b_scale=b_scale, bias=bias)
    out_fmt = None
    group = checks.positive_int(op, "out_group_size", out_group_size)
    ue8m0_out = checks.scale_fmt(op, out_scale_fmt)
    if out_quant is not None:
        out_fmt = checks.quant_format(op, "out_quant", out_quant, a.device)
    # eps floors the re-quantized output's scales; without out_quant it is unused but checked all the same,
    # against the operands' format.
    floor = checks.eps(op, eps, (out_fmt or fmt).qmax)
    a2 = checks.rows(a)
    blocks = (bn, bk) + ((group,) if out_fmt else ())
    profile = capability.profile_for(a.device)

    return Prepared(
        GemmQuery(op, profile, fmt.name, out_fmt.name if out_fmt else None, blocks, m_bucket(a2.shape[0]), (N, K),
                  block_k=bk, out_group=group if out_fmt else 0,
                  fused=bias is not None or act is not None or out_fmt is not None),
        dict(a=a2, a_scale=a_scale.reshape(-1, kb), b=checks.last_dim_contiguous(b), b_scale=b_scale,
             block_n=checks.within(bn, N), block_k=bk, bias=bias, activation=act, out_dtype=out,
             out_quant=out_fmt.dtype if out_fmt else None, out_group=group, ue8m0_out=ue8m0_out, eps=floor,
             profile=profile),
        leading(lead), empty=a2.shape[0] == 0,
    )


def _weight(op: str, w, w_scale, bias, K: int, bn: int, bk: int, names: tuple[str, str]):
    """The GEMM's weight side: w [N, K] (already checked quantized), its block scales and the bias."""
    name, scale_name = names
    if w.shape[1] != K:
        raise checks.fail(op, f"the activation has K={K} but {name} has shape {tuple(w.shape)}; {name} must be [N, K] "
                              "(pass the weight, not its transpose)")
    N = w.shape[0]
    w_scale = checks.matrix(op, scale_name, w_scale, (torch.float32,))
    checks.shape(op, scale_name, w_scale, (math.ceil(N / bn), math.ceil(K / bk)),
                 f"one fp32 scale per {bn}x{bk} block of {name}")
    if bias is not None:
        bias = checks.tensor(op, "bias", bias, FLOAT_DTYPES)
        checks.shape(op, "bias", bias, (N,), "one value per output column")
    return w_scale, bias


def quant_linear(x, w, w_scale, bias=None, *, activation=None, out_dtype=torch.bfloat16, block_size=DEFAULT_BLOCK,
                 scale_fmt="fp32", eps=DEFAULT_EPS) -> Prepared:
    """Spec of `ops.quant_linear`: act_quant(x, group_size=Bk, scale_fmt, eps) into w's format, then
    scaled_mm with w [N, K] and w_scale [ceil(N/Bn), ceil(K/Bk)], bias, activation and out_dtype.
    x [..., K] bf16/fp16/fp32 -> [..., N] out_dtype."""
    op = "quant_linear"
    x = checks.tensor(op, "x", x, FLOAT_DTYPES)
    w = checks.matrix(op, "w", w, (torch.float8_e4m3fn, torch.int8))
    bn, bk = checks.block_pair(op, block_size)
    act = checks.choice(op, "activation", activation, ACTIVATIONS)
    out = checks.out_float(op, "out_dtype", out_dtype)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    fmt = format_of_dtype(w.dtype)
    floor = checks.eps(op, eps, fmt.qmax)
    lead, K = x.shape[:-1], x.shape[-1]
    w_scale, bias = _weight(op, w, w_scale, bias, K, bn, bk, ("w", "w_scale"))
    checks.same_device(op, x=x, w=w, w_scale=w_scale, bias=bias)
    x2 = checks.rows(x)
    profile = capability.profile_for(x.device)
    return Prepared(
        GemmQuery(op, profile, fmt.name, None, (bn, bk), m_bucket(x2.shape[0]), (w.shape[0], K), block_k=bk,
                  fused=bias is not None or act is not None),
        dict(x=x2, w=checks.last_dim_contiguous(w), w_scale=w_scale, block_n=checks.within(bn, w.shape[0]), block_k=bk,
             bias=bias,
             activation=act, out_dtype=out, ue8m0=ue8m0, eps=floor, profile=profile),
        leading(lead), empty=x2.shape[0] == 0,
    )
