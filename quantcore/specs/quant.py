"""Specs of the quantize / dequantize ops: validation, normalisation to the backend contract, output shapes."""

from __future__ import annotations

import math

import torch

from .. import capability
from ..registry.query import Query, m_bucket
from ..formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, SCALE_LAYOUTS
from . import checks
from .base import Prepared, keep, leading


def act_quant(x, *, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP, scale_fmt="fp32", eps=DEFAULT_EPS,
              scale_layout="row", check_finite=False) -> Prepared:
    """Spec of `ops.act_quant`: x [..., K] float -> (q [..., K], scale [..., ceil(K/G)] fp32)."""
    op = "act_quant"
    x = checks.tensor(op, "x", x, FLOAT_DTYPES)
    fmt = checks.quant_format(op, "dtype", dtype, x.device)
    group = checks.positive_int(op, "group_size", group_size)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    floor = checks.eps(op, eps, fmt.qmax)
    layout = checks.choice(op, "scale_layout", scale_layout, SCALE_LAYOUTS)
    if checks.flag(op, "check_finite", check_finite):
        checks.finite(op, "x", x)
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = checks.rows(x)

    profile = capability.profile_for(x.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(group,), m_bucket=m_bucket(x2.shape[0])),
        dict(x=x2, qdtype=fmt.dtype, group_size=checks.within(group, K), ue8m0=ue8m0, eps=floor,
             scale_m_major=layout == "m_major", profile=profile),
        leading(lead), empty=x2.shape[0] == 0,
    )


def act_dequant(q, scale, *, group_size=DEFAULT_GROUP, out_dtype=torch.bfloat16) -> Prepared:
    """Spec of `ops.act_dequant`: q [..., K], scale [..., ceil(K/G)] fp32 -> x [..., K] out_dtype."""
    op = "act_dequant"
    q, fmt = checks.quantized(op, "q", q)
    scale = checks.tensor(op, "scale", scale, (torch.float32,))
    group = checks.positive_int(op, "group_size", group_size)
    out = checks.out_float(op, "out_dtype", out_dtype)
    checks.same_device(op, q=q, scale=scale)
    lead, K = q.shape[:-1], q.shape[-1]
    checks.shape(op, "scale", scale, (*lead, math.ceil(K / group)),
                 f"one fp32 scale per 1x{group} group of q's last dim; pass the group_size used to quantize")
    q2 = checks.rows(q)
    profile = capability.profile_for(q.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(group,), m_bucket=m_bucket(q2.shape[0])),
        dict(q=q2, scale=scale.reshape(-1, scale.shape[-1]), group_size=checks.within(group, K), out_dtype=out,
             profile=profile),
        leading(lead), empty=q2.shape[0] == 0,
    )


def weight_quant(w, *, dtype=torch.float8_e4m3fn, block_size=DEFAULT_BLOCK, scale_fmt="fp32", eps=DEFAULT_EPS,
                 check_finite=False) -> Prepared:
    """Spec of `ops.weight_quant`: w [N, K] float -> (q [N, K], scale [ceil(N/Bn), ceil(K/Bk)] fp32)."""
    op = "weight_quant"
    w = checks.matrix(op, "w", w, FLOAT_DTYPES)
    fmt = checks.quant_format(op, "dtype", dtype, w.device)
    bn, bk = checks.block_pair(op, block_size)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    floor = checks.eps(op, eps, fmt.qmax)
    if checks.flag(op, "check_finite", check_finite):
        checks.finite(op, "w", w)
    profile = capability.profile_for(w.device)
    N, K = w.shape
    return Prepared(
        Query(op, profile, fmt.name, blocks=(bn, bk)),
        dict(w=checks.last_dim_contiguous(w), qdtype=fmt.dtype, block_n=checks.within(bn, N),
             block_k=checks.within(bk, K), ue8m0=ue8m0, eps=floor, profile=profile),
        keep,
    )


def weight_dequant(q, scale, *, block_size=DEFAULT_BLOCK, out_dtype=torch.bfloat16) -> Prepared:
    """Spec of `ops.weight_dequant`: q [N, K], scale [ceil(N/Bn), ceil(K/Bk)] fp32 -> w [N, K] out_dtype."""
    op = "weight_dequant"
    q, fmt = checks.quantized(op, "q", q, min_dim=2)
    q = checks.matrix(op, "q", q, (q.dtype,))
    scale = checks.matrix(op, "scale", scale, (torch.float32,))
    bn, bk = checks.block_pair(op, block_size)
    out = checks.out_float(op, "out_dtype", out_dtype)
    checks.same_device(op, q=q, scale=scale)
    N, K = q.shape
    checks.shape(op, "scale", scale, (math.ceil(N / bn), math.ceil(K / bk)),
                 f"one scale per {bn}x{bk} block of q; pass the block_size used to quantize")
    profile = capability.profile_for(q.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(bn, bk)),
        dict(q=checks.last_dim_contiguous(q), scale=scale, block_n=checks.within(bn, N), block_k=checks.within(bk, K),
             out_dtype=out, profile=profile),
        keep,
    )
