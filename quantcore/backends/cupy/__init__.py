"""The CuPy backend: every op as CUDA C++ (`kernels/*.cu`) compiled by NVRTC for the device's
architecture, launched on torch's current stream through raw pointers (`launch.py`).

It reaches down to Turing (sm_75): the GEMM uses e4m3 MMA on sm_89+, s8 MMA (m16n8k32 on sm_80+,
m8n8k16 on sm_75) for INT8, and on GPUs without FP8 MMA expands e4m3 exactly to fp16 for fp16 MMA
with fp32 accumulation (the `w8a16` variant). sm_70 compiles with NVRTC 12 but CUDA 13's NVRTC no
longer targets it, so the backend asks for sm_75.
"""

from __future__ import annotations

from ...specs.gemm_query import GemmConstraints
from ..base import Constraints, Impl

_MEMORY_BOUND = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "quantized_gelu")
_BASE = dict(min_cc=(7, 5), requires=("cupy",))
# 32: the MMA's K step; 2^31 - 1: the kernel takes the K block as an int; 128: one tile's N.
_GEMM = dict(_BASE, block_k_multiple=32, block_k_max=2**31 - 1, out_group_max=128)

IMPLS = (
    *(Impl(op, "cupy", f"cupy.launch:{op}", Constraints(**_BASE)) for op in _MEMORY_BOUND),
    Impl("dequant_bias", "cupy", "cupy.launch:dequant_bias",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32", "int32"))),
    # quant_linear: act_quant then scaled_mm, the same variants.
    *(impl for op in ("scaled_mm", "quant_linear") for impl in (
        Impl(op, "cupy", f"cupy.launch:{op}", GemmConstraints(**_GEMM, fp8_mma=True, int8_mma=True)),
        Impl(op, "cupy", f"cupy.launch:{op}", GemmConstraints(**_GEMM, max_cc=(8, 9), formats=("fp8_e4m3",)),
             variant="w8a16", fallback="FP8 expanded exactly to fp16, fp16 tensor-core MMA with fp32 accumulation"),
    )),
)
