"""The Triton backend: every op as Triton kernels (`kernels/`), launched through `launch.py`.

FP8 tensors reach kernels as uint8 bits and are encoded/decoded with integer arithmetic, so every
kernel also compiles below sm_89, where Triton refuses the fp8e4nv type; only the GEMM names that
type, behind a compile-time switch taken when the device has FP8 tensor cores. Without them the
GEMM decodes FP8 to bf16 (exact) and runs bf16 MMA: the `w8a16` variant.
"""

from __future__ import annotations

from ..base import Constraints, Impl

_MEMORY_BOUND = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "quantized_gelu")
_BASE = dict(min_cc=(8, 0), requires=("triton",), interpreter=True)

IMPLS = (
    *(Impl(op, "triton", f"triton.launch:{op}", Constraints(**_BASE)) for op in _MEMORY_BOUND),
    Impl("dequant_bias", "triton", "triton.launch:dequant_bias",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32", "int32"))),
    Impl("scaled_mm", "triton", "triton.launch:scaled_mm",
         Constraints(**_BASE, fp8_mma=True, int8_mma=True, pow2_blocks_min=16)),
    Impl("scaled_mm", "triton", "triton.launch:scaled_mm",
         Constraints(**_BASE, formats=("fp8_e4m3",), bf16_mma=True, pow2_blocks_min=16),
         variant="w8a16", fallback="FP8 decoded to bf16 (exact) and multiplied on bf16 tensor cores"),
)
