"""The fused epilogues (dequant + bias after a GEMM, quantized GELU), each defined once: its public
signature and docstring, whose body is its spec (validation, normalisation to the backend contract,
the selection query), its launch arguments, custom op with its fake kernel, and reported formats."""

from __future__ import annotations

import math

import torch

from .. import capability
from ..formats import DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, GELU_APPROXIMATIONS, dtype_name
from . import checks
from .op import CustomOp, OpDef
from .prepared import Prepared, leading
from .query import BackendChoice, Query, m_bucket
from .schema import F32, QUANT_FORMATS, blocks, example_of, same_shape_fake

GEMM_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int32)


def _vector(op: str, name: str, t, length: int, dtypes, what: str) -> torch.Tensor:
    """[length] or [1, length] (seed 002's layout) -> [length]."""
    t = checks.tensor(op, name, t, dtypes)
    if t.numel() != length or t.shape[-1] != length or any(d != 1 for d in t.shape[:-1]):
        raise checks.fail(op, f"{name} has shape {tuple(t.shape)}; expected [{length}] or [1, {length}] ({what})")
    return t.reshape(length)


def dequant_bias(g: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, bias: torch.Tensor | None = None, *,
                 out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """The epilogue after an INT8/FP8 GEMM with per-row and per-column scales:
    out = g · scale_a[m] · scale_b[n] + bias[n], in fp32, cast to out_dtype.

    g: [..., N] bf16/fp16/fp32/int32 (e.g. `torch._int_mm`'s output); scale_a: [...] or [..., 1] fp32;
    scale_b: [N] or [1, N] fp32; bias: [N] or [1, N] float. Returns [..., N] out_dtype.
    """
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


# Reported for the GEMM output dtypes it reads (its selection format is g's dtype), with no blocks.
def _dequant_bias_example(fmt, device="cpu", m=2, n=32, k=512):
    """An example call: g [m, n] of dtype `fmt` (int32 as a GEMM's integer accumulator), positive scales."""
    gen = torch.Generator().manual_seed(0)
    dtype = next(d for d in GEMM_OUT_DTYPES if dtype_name(d) == fmt)
    g = (torch.randint(-2**20, 2**20, (m, n), generator=gen, dtype=dtype) if dtype == torch.int32
         else torch.randn(m, n, generator=gen).to(dtype))
    scale_a, scale_b, bias = torch.rand(m, generator=gen), torch.rand(n, generator=gen), torch.randn(n, generator=gen)
    return tuple(t.to(device) for t in (g, scale_a, scale_b, bias)), {}


DEQUANT_BIAS = OpDef(
    dequant_bias, ("g", "scale_a", "scale_b", "bias"), ("g", "scale_a", "scale_b", "bias", "out_dtype", "profile"),
    tuple(map(dtype_name, GEMM_OUT_DTYPES)), (), (CustomOp("dequant_bias", same_shape_fake),), _dequant_bias_example)


def quantized_gelu(q: torch.Tensor, scale: torch.Tensor, *, group_size: int = DEFAULT_GROUP, approximate: str = "none",
                   out_dtype: torch.dtype | None = None, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                   backend: BackendChoice = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU on quantized activations: dequantize, GELU ("none": erf, "tanh") in fp32, re-quantize per group.

    q: [..., K] fp8/int8; scale: [..., ceil(K/G)] fp32. out_dtype: the output's quantized dtype
    (None keeps q's). Returns (q [..., K], scale [..., ceil(K/G)] fp32).
    """
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


def _quantized_gelu_fake(q, scale, *, group_size=DEFAULT_GROUP, out_dtype=None, **_):
    lead, K = q.shape[:-1], q.shape[-1]
    return (q.new_empty(q.shape, dtype=q.dtype if out_dtype is None else out_dtype),
            q.new_empty(*lead, blocks(K, "quantized_gelu", "group_size", group_size), dtype=F32))


QUANTIZED_GELU = OpDef(
    quantized_gelu, ("q", "scale"),
    ("q", "scale", "group_size", "approximate", "out_qdtype", "ue8m0", "eps", "profile"), QUANT_FORMATS,
    (DEFAULT_GROUP,), (CustomOp("quantized_gelu", _quantized_gelu_fake),), example_of("xq"))
