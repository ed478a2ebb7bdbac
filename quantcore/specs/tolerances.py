"""How close an implementation must come to a float64 computation of the same function (DESIGN.md).

Quantize and dequantize are bit-exact. GEMM-like outputs are judged by relative Frobenius error,
per (input format, output dtype). Re-quantized outputs are judged element by element after
dequantization: within one quantization step of the exact value, because one ulp of fp32 difference
before rounding may move a value to the neighbouring step.
"""

from __future__ import annotations

import torch

EXACT = 0.0
GEMM_FP32_OUT = {"int8": 1e-6, "fp8_e4m3": 1e-5}
LOW_PRECISION_OUT = {torch.bfloat16: 1e-2, torch.float16: 1e-2}
# FP8 tensor-core paths that keep a K block's running sum at the MMA's reduced precision (Hopper
# wgmma: Triton and cuBLAS) declare it in their `numerics`; measured 1.1-1.3e-4 on the H100.
REDUCED_ACCUMULATION_FP32_OUT = 3e-4
REQUANT_SCALE_RTOL = 1e-5  # a re-quantized block's scale follows its amax, itself an fp32-rounded GEMM value


def gemm_tolerance(fmt: str, out_dtype: torch.dtype, exact_accumulation: bool = True) -> float:
    """Relative Frobenius tolerance of a GEMM/epilogue output of `out_dtype` computed from `fmt` data;
    `exact_accumulation=False` for implementations declaring reduced-precision MMA accumulation."""
    if out_dtype == torch.float32:
        return GEMM_FP32_OUT.get(fmt, 1e-6) if exact_accumulation else REDUCED_ACCUMULATION_FP32_OUT
    return LOW_PRECISION_OUT[out_dtype]


def rel_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """‖out − expected‖_F / max(‖expected‖_F, tiny), computed in float64."""
    out, expected = out.double(), expected.double()
    return float((out - expected).norm() / expected.norm().clamp_min(1e-300))


def requant_within_one_step(deq: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor, fmt: str) -> bool:
    """Every dequantized value is within one quantization step of the exact one.

    `scale` is broadcast to `deq`'s shape. INT8's step is the scale; e4m3's is at most 2^-3 of the
    value for normals and 2^-9 of the scale for subnormals.
    """
    deq, exact, scale = deq.double(), exact.double(), scale.double()
    step = scale if fmt == "int8" else torch.maximum(exact.abs() * 2.0**-3, scale * 2.0**-9)
    return bool(((deq - exact).abs() <= step).all())
