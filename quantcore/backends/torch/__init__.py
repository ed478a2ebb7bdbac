"""The torch reference backend: every op, on any device torch runs on, computing the numerics contract
exactly. It is the last entry of every priority list and the oracle of the parity tests."""

from __future__ import annotations

from ..base import Constraints, Impl
from .epilogue import dequant_bias, quantized_gelu
from .gemm import scaled_mm
from .quant import act_dequant, act_quant, weight_dequant, weight_quant

OPS = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "scaled_mm", "quantized_gelu")
_ANYWHERE = Constraints(devices=("cpu", "cuda"))

IMPLS = (
    *(Impl(op, "torch", f"torch:{op}", _ANYWHERE) for op in OPS),
    Impl("dequant_bias", "torch", "torch:dequant_bias",
         Constraints(devices=("cpu", "cuda"), formats=("bfloat16", "float16", "float32", "int32"))),
)

__all__ = ["IMPLS", "act_quant", "act_dequant", "weight_quant", "weight_dequant", "scaled_mm",
           "dequant_bias", "quantized_gelu"]
