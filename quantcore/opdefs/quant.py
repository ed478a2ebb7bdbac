"""The quantize / dequantize ops, each defined once: public signature and docstring, spec, launch
arguments, custom ops with their fake kernels, reported formats."""

from __future__ import annotations

import math

import torch

from .. import specs
from ..formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP
from ..opdef import CustomOp, OpDef
from ..registry import BackendChoice
from .schema import BACKEND, BLOCK, EPS, F32, GROUP, QUANT_FORMATS, blocks, example_of, same_shape_fake


def act_quant(x: torch.Tensor, *, dtype=torch.float8_e4m3fn, group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32",
              eps: float = DEFAULT_EPS, scale_layout: str = "row", check_finite: bool = False,
              backend: BackendChoice = None):
    """Quantize activations per 1×`group_size` group along the last dim.

    x: [..., K] bf16/fp16/fp32. dtype: torch.float8_e4m3fn, torch.int8 or "auto".
    scale_fmt: "fp32" or "ue8m0" (scales rounded up to powers of two). scale_layout: "row" (contiguous
    [..., KB]) or "m_major" (the rows dimension fastest, as cuBLAS/DeepGEMM want).
    Returns (q [..., K] dtype, scale [..., ceil(K/group_size)] fp32). A block with NaN/Inf gets a
    non-finite scale (or raises `NonFiniteInputError` with check_finite=True); other blocks are unaffected.
    """


# Fake kernels: the outputs' shapes, dtypes and strides from the inputs' shapes alone. They do not run
# the specs, which also build the selection query (its M bucket would specialise a dynamic M).
def _act_quant_fake(x, *, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP, scale_layout="row", **_):
    lead, K = x.shape[:-1], x.shape[-1]
    kb = blocks(K, "act_quant", "group_size", group_size)
    if scale_layout == "m_major":  # as the real op builds it: [KB, M] contiguous, transposed, reshaped
        scale = x.new_empty(kb, math.prod(lead), dtype=F32).t().reshape(*lead, kb)
    else:
        scale = x.new_empty(*lead, kb, dtype=F32)
    return x.new_empty(x.shape, dtype=dtype), scale


def _act_quant_layout(out, options):
    # The M-major scale is a transposed view by contract; everything else is contiguous.
    q, scale = out
    return q.contiguous(), scale if options.get("scale_layout") == "m_major" else scale.contiguous()


ACT_QUANT = OpDef(
    act_quant, specs.act_quant, ("x",),
    ("x", "qdtype", "group_size", "ue8m0", "eps", "scale_m_major", "profile"), QUANT_FORMATS, (DEFAULT_GROUP,),
    (CustomOp("act_quant", f'(Tensor x, *, ScalarType dtype=float8_e4m3fn, {GROUP}, str scale_fmt="fp32", {EPS}, '
                           f'str scale_layout="row", bool check_finite=False, {BACKEND}) -> (Tensor, Tensor)',
              _act_quant_fake, _act_quant_layout),), example_of("x", quantize=True))


def act_dequant(q: torch.Tensor, scale: torch.Tensor, *, group_size: int = DEFAULT_GROUP,
                out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """Dequantize activations: q [..., K] (fp8/int8), scale [..., ceil(K/G)] fp32 (any layout) -> [..., K] out_dtype."""


ACT_DEQUANT = OpDef(
    act_dequant, specs.act_dequant, ("q", "scale"), ("q", "scale", "group_size", "out_dtype", "profile"),
    QUANT_FORMATS, (DEFAULT_GROUP,),
    (CustomOp("act_dequant", f"(Tensor q, Tensor scale, *, {GROUP}, ScalarType out_dtype=bfloat16, {BACKEND}) "
                             "-> Tensor", same_shape_fake),), example_of("xq"))


def weight_quant(w: torch.Tensor, *, dtype=torch.float8_e4m3fn, block_size: tuple[int, int] = DEFAULT_BLOCK,
                 scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, check_finite: bool = False,
                 backend: BackendChoice = None):
    """Quantize a weight per Bn×Bk block: w [N, K] bf16/fp16/fp32 -> (q [N, K] dtype,
    scale [ceil(N/Bn), ceil(K/Bk)] fp32), the DeepSeek-V3 `weight_scale_inv` layout."""


def _weight_quant_fake(w, *, dtype=torch.float8_e4m3fn, block_size=DEFAULT_BLOCK, **_):
    N, K = w.shape
    return (w.new_empty(N, K, dtype=dtype),
            w.new_empty(blocks(N, "weight_quant", "block_size[0]", block_size[0]),
                        blocks(K, "weight_quant", "block_size[1]", block_size[1]), dtype=F32))


WEIGHT_QUANT = OpDef(
    weight_quant, specs.weight_quant, ("w",), ("w", "qdtype", "block_n", "block_k", "ue8m0", "eps", "profile"),
    QUANT_FORMATS, DEFAULT_BLOCK,
    (CustomOp("weight_quant", f'(Tensor w, *, ScalarType dtype=float8_e4m3fn, {BLOCK}, str scale_fmt="fp32", '
                              f"{EPS}, bool check_finite=False, {BACKEND}) -> (Tensor, Tensor)",
              _weight_quant_fake),), example_of("w", quantize=True))


def weight_dequant(q: torch.Tensor, scale: torch.Tensor, *, block_size: tuple[int, int] = DEFAULT_BLOCK,
                   out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """Dequantize a block-quantized weight: q [N, K], scale [ceil(N/Bn), ceil(K/Bk)] fp32 -> [N, K] out_dtype."""


WEIGHT_DEQUANT = OpDef(
    weight_dequant, specs.weight_dequant, ("q", "scale"), ("q", "scale", "block_n", "block_k", "out_dtype", "profile"),
    QUANT_FORMATS, DEFAULT_BLOCK,
    (CustomOp("weight_dequant", f"(Tensor q, Tensor scale, *, {BLOCK}, ScalarType out_dtype=bfloat16, {BACKEND}) "
                                "-> Tensor", same_shape_fake),), example_of("wq"))
