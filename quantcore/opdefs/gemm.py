"""The block-scaled GEMM and the quantized linear layer, each defined once: public signature and
docstring, spec, launch arguments, custom ops with their fake kernels, reported formats."""

from __future__ import annotations

import torch

from .. import gradients, specs
from ..formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP
from ..opdef import CustomOp, Gradient, OpDef
from ..registry import BackendChoice
from .schema import BACKEND, BLOCK, EPS, F32, QUANT_FORMATS, blocks, example_of

_GEMM_ARGS = "Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor? bias=None"
_EPILOGUE = ("bias", "activation", "out_dtype")


def scaled_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
              bias: torch.Tensor | None = None, activation: str | None = None, out_dtype: torch.dtype = torch.bfloat16,
              out_quant=None, block_size: tuple[int, int] = DEFAULT_BLOCK, out_group_size: int = DEFAULT_GROUP,
              out_scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, backend: BackendChoice = None):
    """Block-scaled GEMM `a[..., K] @ b[N, K]^T` with FP8 or INT8 operands and a fused epilogue.

    a: [..., K] fp8/int8 with a_scale [..., ceil(K/Bk)] fp32 (act_quant with group_size=Bk);
    b: [N, K] same dtype with b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (weight_quant with block_size).
    Per K block the dot is accumulated in fp32 (FP8) or exactly in int32 (INT8), then scaled into fp32.
    Epilogue: + bias [N], activation (None, "gelu", "gelu_tanh", "silu"), then a cast to out_dtype
    (returns [..., N]) or, with out_quant a quantized dtype, re-quantization per 1×out_group_size
    (returns (q [..., N], scale [..., ceil(N/out_group_size)])).
    """


# Fake kernels: the outputs' shapes, dtypes and strides from the inputs' shapes alone (not the specs:
# their selection query's M bucket would specialise a dynamic M).
def _scaled_mm_fake(a, a_scale, b, b_scale, bias=None, *, out_dtype=torch.bfloat16, **_):
    return a.new_empty(*a.shape[:-1], b.shape[0], dtype=out_dtype)


def _scaled_mm_quant_fake(a, a_scale, b, b_scale, bias=None, *, out_quant, out_group_size=DEFAULT_GROUP, **_):
    lead, N = a.shape[:-1], b.shape[0]
    groups = blocks(N, "scaled_mm", "out_group_size", out_group_size)
    return a.new_empty(*lead, N, dtype=out_quant), a.new_empty(*lead, groups, dtype=F32)


# One custom op per return type, where `ops.scaled_mm` returns either.
SCALED_MM = OpDef(
    scaled_mm, specs.scaled_mm, ("a", "a_scale", "b", "b_scale", "bias"),
    ("a", "a_scale", "b", "b_scale", "block_n", "block_k", *_EPILOGUE, "out_quant", "out_group", "ue8m0_out", "eps",
     "profile"),
    QUANT_FORMATS, DEFAULT_BLOCK,
    (CustomOp("scaled_mm", f"({_GEMM_ARGS}, *, str? activation=None, ScalarType out_dtype=bfloat16, {BLOCK}, "
                           f"{BACKEND}) -> Tensor", _scaled_mm_fake,
              gradient=Gradient(("bias",), gradients.scaled_mm, lambda options: options["out_quant"] is None,
                                " (quant_linear takes the float activation and gives it a gradient)")),
     CustomOp("scaled_mm_quant", f'({_GEMM_ARGS}, *, ScalarType out_quant, str? activation=None, {BLOCK}, '
                                 f'int out_group_size={DEFAULT_GROUP}, str out_scale_fmt="fp32", {EPS}, '
                                 f"{BACKEND}) -> (Tensor, Tensor)", _scaled_mm_quant_fake)),
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


def _quant_linear_fake(x, w, w_scale, bias=None, *, out_dtype=torch.bfloat16, **_):
    return x.new_empty(*x.shape[:-1], w.shape[0], dtype=out_dtype)


QUANT_LINEAR = OpDef(
    quant_linear, specs.quant_linear, ("x", "w", "w_scale", "bias"),
    ("x", "w", "w_scale", "block_n", "block_k", *_EPILOGUE, "ue8m0", "eps", "profile"),
    QUANT_FORMATS, DEFAULT_BLOCK,
    (CustomOp("quant_linear", f'(Tensor x, Tensor w, Tensor w_scale, Tensor? bias=None, *, str? activation=None, '
                              f'ScalarType out_dtype=bfloat16, {BLOCK}, str scale_fmt="fp32", {EPS}, {BACKEND}) '
                              "-> Tensor", _quant_linear_fake, gradient=Gradient(("x", "bias"), gradients.quant_linear)),),
    example_of("x", "wq"))
