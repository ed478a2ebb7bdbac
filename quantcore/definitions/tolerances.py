"""How close an implementation must come to a float64 computation of the same function
(docs/numerics.md, "Tolerances").

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
# The opt-in torch[bf16_dequant] GEMM (docs/numerics.md, "bf16-dequantized GEMM"): an operand
# bf16(fp32(q·scale)) is within u = 2^-8 + 2^-24 + 2^-32 of q·scale (two roundings), so a product of
# two within 2u + u² < 2^-7 + 2^-15; the GEMM sums those products (exact in fp32) in fp32, each
# addition within 2^-23 relative (one ulp: tensor cores may truncate instead of rounding).
BF16_DEQUANT_PRODUCT = 2.0**-7 + 2.0**-15
BF16_DEQUANT_ADDITION = 2.0**-23
# Input gradients of quant_linear / scaled_mm against torch autograd of the straight-through float
# function (dequantized weight): act' at two computations of the pre-activation (the op's GEMM, an fp32
# matmul of dequantized values), then a matmul in the gradient's dtype. Relative Frobenius error.
GRADIENT = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
REQUANT_SCALE_RTOL = 1e-5  # a re-quantized block's scale follows its amax, itself an fp32-rounded GEMM value
# Elementwise activations in fp32: ulps of the exact value, counting the input's rounding amplified by
# the function's condition number. Measured on the CPU: up to ~5 for the reference and the Triton
# interpreter alike.
ACTIVATION_ULPS = 16
_FP32_ULP = 2.0**-24
_SMALLEST_SUBNORMAL = 2.0**-149


def gemm_tolerance(fmt: str, out_dtype: torch.dtype, exact_accumulation: bool = True) -> float:
    """Relative Frobenius tolerance of a GEMM/epilogue output of `out_dtype` computed from `fmt` data;
    `exact_accumulation=False` for implementations declaring reduced-precision MMA accumulation."""
    if out_dtype == torch.float32:
        return GEMM_FP32_OUT.get(fmt, 1e-6) if exact_accumulation else REDUCED_ACCUMULATION_FP32_OUT
    return LOW_PRECISION_OUT[out_dtype]


def bf16_dequant_bound(k: int) -> float:
    """Bound on |acc − exact| / Σ_k |a_k·b_k| for every fp32 GEMM result (before the epilogue) of
    torch[bf16_dequant] with K = k, a_k and b_k the exact dequantized operands: the products' error
    compounded with the worst case of k fp32 additions, γ = k·2^-23 / (1 − k·2^-23)."""
    gamma = k * BF16_DEQUANT_ADDITION / (1 - k * BF16_DEQUANT_ADDITION)
    return (1 + BF16_DEQUANT_PRODUCT) * (1 + gamma) - 1


def rel_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    """‖out − expected‖_F / max(‖expected‖_F, tiny), computed in float64."""
    out, expected = out.double(), expected.double()
    return float((out - expected).norm() / expected.norm().clamp_min(1e-300))


def activation_within(out: torch.Tensor, exact: torch.Tensor, condition: torch.Tensor) -> bool:
    """Every fp32 activation value is within ACTIVATION_ULPS ulps·(1 + condition) of the exact value
    (`condition` = |x·f'(x)/f(x)|, so that the input's own fp32 rounding counts as amplified: GELU's
    grows like x² in the negative tail), plus one subnormal step below the normal range; and none is
    zero where the exact value is at least the smallest fp32 subnormal (no −0 for a negative value)."""
    out, exact, condition = out.double(), exact.double(), condition.double()
    bound = ACTIVATION_ULPS * _FP32_ULP * (1 + condition) * exact.abs() + _SMALLEST_SUBNORMAL
    nonzero = (out != 0) | (exact.abs() < _SMALLEST_SUBNORMAL)
    return bool(((out - exact).abs() <= bound).all() and nonzero.all())


def requant_within_one_step(deq: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor, fmt: str) -> bool:
    """Every dequantized value is within one quantization step of the exact one.

    `scale` is broadcast to `deq`'s shape. INT8's step is the scale; e4m3's is at most 2^-3 of the
    value for normals and 2^-9 of the scale for subnormals.
    """
    deq, exact, scale = deq.double(), exact.double(), scale.double()
    step = scale if fmt == "int8" else torch.maximum(exact.abs() * 2.0**-3, scale * 2.0**-9)
    return bool(((deq - exact).abs() <= step).all())
