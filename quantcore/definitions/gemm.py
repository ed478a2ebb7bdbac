"""The block-scaled GEMM and the quantized linear layer, each defined once: its public signature and
docstring, whose body is its spec (validation, normalisation to the backend contract, the selection
query), its launch arguments, custom ops with their fake kernels and gradients, and reported formats."""

from __future__ import annotations

import math

import torch

from .. import capability
from ..formats import ACTIVATIONS, DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, dtype_name, format_of_dtype
from . import checks, gradients
from .op import CustomOp, Gradient, OpDef
from .prepared import Prepared, leading
from .query import BackendChoice, GemmQuery, m_bucket
from .schema import F32, QUANT_FORMATS, blocks, example_of

_EPILOGUE = ("bias", "activation", "out_dtype")


def scaled_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
              bias: torch.Tensor | None = None, activation: str | None = None, out_dtype: torch.dtype = torch.bfloat16,
              out_quant: torch.dtype | None = None, block_size: tuple[int, int] = DEFAULT_BLOCK,
              out_group_size: int = DEFAULT_GROUP, out_scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
              backend: BackendChoice = None):
    """Block-scaled GEMM `a[..., K] @ b[N, K]^T` with FP8 or INT8 operands and a fused epilogue.

    a: [..., K] fp8/int8 with a_scale [..., ceil(K/Bk)] fp32 (act_quant with group_size=Bk);
    b: [N, K] same dtype with b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (weight_quant with block_size).
    Per K block the dot is accumulated in fp32 (FP8) or exactly in int32 (INT8), then scaled into fp32.
    Epilogue: + bias [N], activation (None, "gelu", "gelu_tanh", "silu"), then a cast to out_dtype
    (returns [..., N]) or, with out_quant a quantized dtype, re-quantization per 1×out_group_size
    (returns (q [..., N], scale [..., ceil(N/out_group_size)])).
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
    block_dims = (bn, bk) + ((group,) if out_fmt else ())
    profile = capability.profile_for(a.device)
    return Prepared(
        GemmQuery(op, profile, fmt.name, out_fmt.name if out_fmt else None, block_dims, m_bucket(a2.shape[0]), (N, K),
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


# Fake kernels: the outputs' shapes, dtypes and strides from the inputs' shapes alone (not the specs:
# their selection query's M bucket would specialise a dynamic M).
def _scaled_mm_fake(a, a_scale, b, b_scale, bias=None, *, out_dtype=torch.bfloat16, **_):
    return a.new_empty(*a.shape[:-1], b.shape[0], dtype=out_dtype)


def _scaled_mm_quant_fake(a, a_scale, b, b_scale, bias=None, *, out_quant, out_group_size=DEFAULT_GROUP, **_):
    lead, N = a.shape[:-1], b.shape[0]
    groups = blocks(N, "scaled_mm", "out_group_size", out_group_size)
    return a.new_empty(*lead, N, dtype=out_quant), a.new_empty(*lead, groups, dtype=F32)


# One custom op per return type, where `ops.scaled_mm` returns either; the float output's takes no
# re-quantization option, the re-quantized one's requires `out_quant` and has no `out_dtype`.
SCALED_MM = OpDef(
    scaled_mm, ("a", "a_scale", "b", "b_scale", "bias"),
    ("a", "a_scale", "b", "b_scale", "block_n", "block_k", *_EPILOGUE, "out_quant", "out_group", "ue8m0_out", "eps",
     "profile"),
    QUANT_FORMATS, DEFAULT_BLOCK,
    (CustomOp("scaled_mm", _scaled_mm_fake, returns=1, omit=("out_quant", "out_group_size", "out_scale_fmt", "eps"),
              gradient=Gradient(("bias",), gradients.scaled_mm,
                                " (quant_linear takes the float activation and gives it a gradient)"),
              serves=lambda options: options["out_quant"] is None),
     CustomOp("scaled_mm_quant", _scaled_mm_quant_fake, returns=2, omit=("out_dtype",), required=("out_quant",),
              serves=lambda options: options["out_quant"] is not None)),
    example_of("xq", "wq"))


def quant_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
                 activation: str | None = None, out_dtype: torch.dtype = torch.bfloat16,
                 block_size: tuple[int, int] = DEFAULT_BLOCK, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                 backend: BackendChoice = None) -> torch.Tensor:
    """A quantized linear layer in one call: `act_quant(x, dtype=w.dtype, group_size=Bk, scale_fmt, eps)`
    followed by `scaled_mm(..., w, w_scale, bias=bias, activation=activation, out_dtype=out_dtype,
    block_size=block_size)`, bit for bit, on the same backend.

    x: [..., K] bf16/fp16/fp32; w: [N, K] fp8_e4m3fn/int8 with w_scale [ceil(N/Bn), ceil(K/Bk)] fp32
    (weight_quant's output); bias: [N] or None. Returns [..., N] out_dtype. Where the Triton backend's
    table says so (on the H100 up to 64 rows, and to 128 rows up to K = 4096) the decode GEMM quantizes
    the activation itself: one launch instead of two, outside CUDA-graph captures from 9 rows.
    """
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
        dict(x=x2, w=checks.last_dim_contiguous(w), w_scale=w_scale, block_n=checks.within(bn, w.shape[0]),
             block_k=bk, bias=bias, activation=act, out_dtype=out, ue8m0=ue8m0, eps=floor, profile=profile),
        leading(lead), empty=x2.shape[0] == 0,
    )


def _quant_linear_fake(x, w, w_scale, bias=None, *, out_dtype=torch.bfloat16, **_):
    return x.new_empty(*x.shape[:-1], w.shape[0], dtype=out_dtype)


QUANT_LINEAR = OpDef(
    quant_linear, ("x", "w", "w_scale", "bias"),
    ("x", "w", "w_scale", "block_n", "block_k", *_EPILOGUE, "ue8m0", "eps", "profile"),
    QUANT_FORMATS, DEFAULT_BLOCK,
    (CustomOp("quant_linear", _quant_linear_fake, gradient=Gradient(("x", "bias"), gradients.quant_linear)),),
    example_of("x", "wq"))
