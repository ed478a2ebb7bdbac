"""Specs of the fused epilogues: dequant + bias after an integer/FP8 GEMM, and quantized GELU."""

from __future__ import annotations

import math

import torch

from .. import capability
from ..registry.query import Query, m_bucket
from ..formats import DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, GELU_APPROXIMATIONS, dtype_name
from . import checks
from .base import Prepared, leading

GEMM_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int32)


def _vector(op: str, name: str, t, length: int, dtypes, what: str) -> torch.Tensor:
    """[length] or [1, length] (seed 002's layout) -> [length]."""
    t = checks.tensor(op, name, t, dtypes)
    if t.numel() != length or t.shape[-1] != length or any(d != 1 for d in t.shape[:-1]):
        raise checks.fail(op, f"{name} has shape {tuple(t.shape)}; expected [{length}] or [1, {length}] ({what})")
    return t.reshape(length)


def dequant_bias(g, scale_a, scale_b, bias=None, *, out_dtype=torch.bfloat16) -> Prepared:
    """Spec of `ops.dequant_bias`: g [..., N] (bf16/fp16/fp32/int32), scale_a [...] or [..., 1] fp32 per row,
    scale_b [N] or [1, N] fp32 per column, bias [N] or [1, N] -> g·sa·sb + bias as [..., N] out_dtype."""
    op = "dequant_bias"
    g = checks.tensor(op, "g", g, GEMM_OUT_DTYPES)
    lead, N = g.shape[:-1], g.shape[-1]
    g2 = checks.rows(g)
    M = g2.shape[0]
    scale_a = checks.tensor(op, "scale_a", scale_a, (torch.float32,), min_dim=0, empty_last=True)
    if tuple(scale_a.shape) not in (tuple(lead), (*lead, 1)):
        raise checks.fail(op, f"scale_a has shape {tuple(scale_a.shape)}; expected {tuple(lead)} or "
                              f"{(*lead, 1)} (one fp32 scale per row of g)")
    scale_b = _vector(op, "scale_b", scale_b, N, (torch.float32,), "one fp32 scale per column of g")
    if bias is not None:
        bias = _vector(op, "bias", bias, N, FLOAT_DTYPES, "one value per column of g")
    out = checks.out_float(op, "out_dtype", out_dtype)
    checks.same_device(op, g=g, scale_a=scale_a, scale_b=scale_b, bias=bias)
    profile = capability.profile_for(g.device)
    return Prepared(
        Query(op, profile, dtype_name(g.dtype), m_bucket=m_bucket(M)),
        dict(g=g2, scale_a=scale_a.reshape(M), scale_b=scale_b, bias=bias, out_dtype=out, profile=profile),
        leading(lead), empty=M == 0,
    )


def quantized_gelu(q, scale, *, group_size=DEFAULT_GROUP, approximate="none", out_dtype=None, scale_fmt="fp32",
                   eps=DEFAULT_EPS) -> Prepared:
    """Spec of `ops.quantized_gelu`: (q [..., K], scale [..., ceil(K/G)]) -> GELU re-quantized as
    (q [..., K] out_dtype (default q's dtype), scale [..., ceil(K/G)] fp32)."""
    op = "quantized_gelu"
    q, fmt = checks.quantized(op, "q", q)
    scale = checks.tensor(op, "scale", scale, (torch.float32,))
    group = checks.positive_int(op, "group_size", group_size)
    approx = checks.choice(op, "approximate", approximate, GELU_APPROXIMATIONS)
    out_fmt = fmt if out_dtype is None else checks.quant_format(op, "out_dtype", out_dtype, q.device)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    floor = checks.eps(op, eps, out_fmt.qmax)
    checks.same_device(op, q=q, scale=scale)
    lead, K = q.shape[:-1], q.shape[-1]
    checks.shape(op, "scale", scale, (*lead, math.ceil(K / group)), f"one fp32 scale per 1x{group} group of q")
    q2 = checks.rows(q)
    profile = capability.profile_for(q.device)

    return Prepared(
        Query(op, profile, fmt.name, out_fmt.name, (group,), m_bucket(q2.shape[0])),
        dict(q=q2, scale=scale.reshape(-1, scale.shape[-1]), group_size=checks.within(group, K), approximate=approx,
             out_qdtype=out_fmt.dtype, ue8m0=ue8m0, eps=floor, profile=profile),
        leading(lead), empty=q2.shape[0] == 0,
    )
