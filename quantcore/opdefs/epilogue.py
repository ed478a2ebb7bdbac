"""The fused epilogues (dequant + bias after a GEMM, quantized GELU), each defined once: public
signature and docstring, spec, launch arguments, custom ops with their fake kernels, reported formats."""

from __future__ import annotations

import torch

from .. import specs
from ..formats import DEFAULT_EPS, DEFAULT_GROUP, dtype_name
from ..opdef import CustomOp, OpDef
from ..registry import BackendChoice
from ..specs.epilogue import GEMM_OUT_DTYPES
from .schema import BACKEND, EPS, F32, GROUP, QUANT_FORMATS, blocks, example_of, same_shape_fake


def dequant_bias(g: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, bias: torch.Tensor | None = None, *,
                 out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """The epilogue after an INT8/FP8 GEMM with per-row and per-column scales:
    out = g · scale_a[m] · scale_b[n] + bias[n], in fp32, cast to out_dtype.

    g: [..., N] bf16/fp16/fp32/int32 (e.g. `torch._int_mm`'s output); scale_a: [...] or [..., 1] fp32;
    scale_b: [N] or [1, N] fp32; bias: [N] or [1, N] float. Returns [..., N] out_dtype.
    """


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
    dequant_bias, specs.dequant_bias, ("g", "scale_a", "scale_b", "bias"),
    ("g", "scale_a", "scale_b", "bias", "out_dtype", "profile"), tuple(map(dtype_name, GEMM_OUT_DTYPES)), (),
    (CustomOp("dequant_bias", f"(Tensor g, Tensor scale_a, Tensor scale_b, Tensor? bias=None, *, "
                              f"ScalarType out_dtype=bfloat16, {BACKEND}) -> Tensor", same_shape_fake),),
    _dequant_bias_example)


def quantized_gelu(q: torch.Tensor, scale: torch.Tensor, *, group_size: int = DEFAULT_GROUP, approximate: str = "none",
                   out_dtype=None, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                   backend: BackendChoice = None):
    """GELU on quantized activations: dequantize, GELU ("none": erf, "tanh") in fp32, re-quantize per group.

    q: [..., K] fp8/int8; scale: [..., ceil(K/G)] fp32. out_dtype: the output's quantized dtype
    (None keeps q's). Returns (q [..., K], scale [..., ceil(K/G)] fp32).
    """


def _quantized_gelu_fake(q, scale, *, group_size=DEFAULT_GROUP, out_dtype=None, **_):
    lead, K = q.shape[:-1], q.shape[-1]
    return (q.new_empty(q.shape, dtype=q.dtype if out_dtype is None else out_dtype),
            q.new_empty(*lead, blocks(K, "quantized_gelu", "group_size", group_size), dtype=F32))


QUANTIZED_GELU = OpDef(
    quantized_gelu, specs.quantized_gelu, ("q", "scale"),
    ("q", "scale", "group_size", "approximate", "out_qdtype", "ue8m0", "eps", "profile"), QUANT_FORMATS,
    (DEFAULT_GROUP,),
    (CustomOp("quantized_gelu", f'(Tensor q, Tensor scale, *, {GROUP}, str approximate="none", '
                                f'ScalarType? out_dtype=None, str scale_fmt="fp32", {EPS}, {BACKEND}) '
                                "-> (Tensor, Tensor)", _quantized_gelu_fake),),
    example_of("xq"))
