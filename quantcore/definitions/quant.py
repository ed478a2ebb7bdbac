"""The quantize / dequantize ops, each defined once: its public signature and docstring, whose body is
its spec (validation, normalisation to the backend contract, the selection query), its launch
arguments, custom op and fake kernel, and reported formats."""

from __future__ import annotations

import math

import torch

from .. import capability
from ..formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, SCALE_LAYOUTS
from . import checks
from .op import CustomOp, OpDef
from .prepared import Prepared, keep, leading
from .query import BackendChoice, Query, m_bucket
from .schema import F32, QUANT_FORMATS, blocks, example_of, same_shape_fake


def act_quant(x: torch.Tensor, *, dtype=torch.float8_e4m3fn, group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32",
              eps: float = DEFAULT_EPS, scale_layout: str = "row", check_finite: bool = False,
              backend: BackendChoice = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations per 1×`group_size` group along the last dim.

    x: [..., K] bf16/fp16/fp32. dtype: torch.float8_e4m3fn, torch.int8 or "auto".
    scale_fmt: "fp32" or "ue8m0" (scales rounded up to powers of two). scale_layout: "row" (contiguous
    [..., KB]) or "m_major" (the rows dimension fastest, as cuBLAS/DeepGEMM want).
    Returns (q [..., K] dtype, scale [..., ceil(K/group_size)] fp32). A block with NaN/Inf gets a
    non-finite scale (or raises `NonFiniteInputError` with check_finite=True); other blocks are unaffected.
    """
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


# Fake kernels: the outputs' shapes, dtypes and strides from the inputs' shapes alone. They do not run
# the specs, which also build the selection query (its M bucket would specialise a dynamic M).
def quantized_fake(t, lead, K, op: str, *, dtype, group_size, scale_layout):
    """The fake (codes [*lead, K] `dtype`, scale [*lead, ceil(K/group_size)] fp32) of an op that quantizes
    per 1×group_size along a last dim of K (act_quant, and the fused producers of `definitions.producers`),
    made like `t`; an M-major scale as the real ops build it: [KB, M] contiguous, transposed, reshaped."""
    kb = blocks(K, op, "group_size", group_size)
    if scale_layout == "m_major":
        scale = t.new_empty(kb, math.prod(lead), dtype=F32).t().reshape(*lead, kb)
    else:
        scale = t.new_empty(*lead, kb, dtype=F32)
    return t.new_empty(*lead, K, dtype=dtype), scale


def _act_quant_fake(x, *, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP, scale_layout="row", **_):
    return quantized_fake(x, x.shape[:-1], x.shape[-1], "act_quant", dtype=dtype, group_size=group_size,
                          scale_layout=scale_layout)


def quantized_layout(out, options):
    """The real outputs in their fakes' layout: the M-major scale (the second output) is a transposed view by
    contract; everything else is contiguous."""
    m_major = options.get("scale_layout") == "m_major"
    return tuple(t if i == 1 and m_major else t.contiguous() for i, t in enumerate(out))


ACT_QUANT = OpDef(
    act_quant, ("x",), ("x", "qdtype", "group_size", "ue8m0", "eps", "scale_m_major", "profile"), QUANT_FORMATS,
    (DEFAULT_GROUP,), (CustomOp("act_quant", _act_quant_fake, quantized_layout),), example_of("x", quantize=True))


def act_dequant(q: torch.Tensor, scale: torch.Tensor, *, group_size: int = DEFAULT_GROUP,
                out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """Dequantize activations: q [..., K] (fp8/int8), scale [..., ceil(K/G)] fp32 (any layout) -> [..., K] out_dtype."""
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


ACT_DEQUANT = OpDef(
    act_dequant, ("q", "scale"), ("q", "scale", "group_size", "out_dtype", "profile"), QUANT_FORMATS,
    (DEFAULT_GROUP,), (CustomOp("act_dequant", same_shape_fake),), example_of("xq"))


def weight_quant(w: torch.Tensor, *, dtype=torch.float8_e4m3fn, block_size: tuple[int, int] = DEFAULT_BLOCK,
                 scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, check_finite: bool = False,
                 backend: BackendChoice = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight per Bn×Bk block: w [N, K] bf16/fp16/fp32 -> (q [N, K] dtype,
    scale [ceil(N/Bn), ceil(K/Bk)] fp32), the DeepSeek-V3 `weight_scale_inv` layout."""
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


def _weight_quant_fake(w, *, dtype=torch.float8_e4m3fn, block_size=DEFAULT_BLOCK, **_):
    N, K = w.shape
    return (w.new_empty(N, K, dtype=dtype),
            w.new_empty(blocks(N, "weight_quant", "block_size[0]", block_size[0]),
                        blocks(K, "weight_quant", "block_size[1]", block_size[1]), dtype=F32))


WEIGHT_QUANT = OpDef(
    weight_quant, ("w",), ("w", "qdtype", "block_n", "block_k", "ue8m0", "eps", "profile"), QUANT_FORMATS,
    DEFAULT_BLOCK, (CustomOp("weight_quant", _weight_quant_fake),), example_of("w", quantize=True))


def weight_dequant(q: torch.Tensor, scale: torch.Tensor, *, block_size: tuple[int, int] = DEFAULT_BLOCK,
                   out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """Dequantize a block-quantized weight: q [N, K], scale [ceil(N/Bn), ceil(K/Bk)] fp32 -> [N, K] out_dtype."""
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


WEIGHT_DEQUANT = OpDef(
    weight_dequant, ("q", "scale"), ("q", "scale", "block_n", "block_k", "out_dtype", "profile"), QUANT_FORMATS,
    DEFAULT_BLOCK, (CustomOp("weight_dequant", same_shape_fake),), example_of("wq"))
