"""The CuPy backend: every op as CUDA C++ (`kernels/*.cu`) compiled by NVRTC for the device's
architecture, launched on torch's current stream through raw pointers (`launch.py`).

It reaches down to Turing (sm_75): the GEMM uses e4m3 MMA on sm_89+, s8 MMA (m16n8k32 on sm_80+,
m8n8k16 on sm_75) for INT8, and on GPUs without FP8 MMA expands e4m3 exactly to fp16 for fp16 MMA
with fp32 accumulation (the `w8a16` variant). sm_70 compiles with NVRTC 12 but CUDA 13's NVRTC no
longer targets it, so the backend asks for sm_75.

Each GEMM variant names its tensor-core path in `options` (`mma`: "fp8", "int8" or "fp16"), which the
dispatcher passes to the launch: what `explain()` names is what runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ...registry.impl import Constraints, GemmConstraints, Impl

if TYPE_CHECKING:
    from ...definitions.query import Query

_MEMORY_BOUND = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "quantized_gelu")
_BASE = dict(min_cc=(7, 5), requires=("cupy",))
# 32: the MMA's K step; 2^31 - 1: the kernel takes the K block as an int; 128: one tile's N.
_GEMM = dict(_BASE, block_k_multiple=32, block_k_max=2**31 - 1, out_group_max=128)
# What the e4m3 and s8 kernels' epilogue may re-quantize to: either format, FP8 where the GPU has FP8
# tensor cores (the rule of these kernels before they were split by MMA kind, kept as it was).
_REQUANT = Constraints(fp8_mma=True)


class _NativeGemm(Impl):
    """A GEMM kernel on the GPU's own tensor cores for its input format (`constraints.formats`: what
    it reads); a re-quantized output may be in the other format (`_REQUANT`), which a plain
    `Constraints.formats` would refuse."""

    def not_supported_reasons(self, query: Query) -> list[str]:
        why = self.constraints.reasons(dataclasses.replace(query, out_fmt=None))
        if query.out_fmt is not None:
            out = _REQUANT.reasons(dataclasses.replace(query, fmt=query.out_fmt, out_fmt=None))
            why += [r for r in out if r not in why]
        return why


IMPLS = (
    *(Impl(op, "cupy", f"cupy.launch:{op}", Constraints(**_BASE)) for op in _MEMORY_BOUND),
    *(Impl(op, "cupy", f"cupy.producers:{op}", Constraints(**_BASE)) for op in ("rms_norm_quant", "silu_mul_quant")),
    Impl("dequant_bias", "cupy", "cupy.launch:dequant_bias",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32", "int32"))),
    # quant_linear: act_quant then scaled_mm, the same variants.
    *(impl for op in ("scaled_mm", "quant_linear") for impl in (
        _NativeGemm(op, "cupy", f"cupy.launch:{op}", GemmConstraints(**_GEMM, formats=("fp8_e4m3",), fp8_mma=True),
                    options=(("mma", "fp8"),)),
        _NativeGemm(op, "cupy", f"cupy.launch:{op}", GemmConstraints(**_GEMM, formats=("int8",), int8_mma=True),
                    options=(("mma", "int8"),)),
        Impl(op, "cupy", f"cupy.launch:{op}", GemmConstraints(**_GEMM, max_cc=(8, 9), formats=("fp8_e4m3",)),
             variant="w8a16", fallback="FP8 expanded exactly to fp16, fp16 tensor-core MMA with fp32 accumulation",
             options=(("mma", "fp16"),)),
    )),
    # The grouped (mixture-of-experts) GEMMs: gemm_kernel's grouped instantiations, the same variants.
    *(impl for op in ("grouped_mm", "grouped_mm_masked") for impl in (
        _NativeGemm(op, "cupy", f"cupy.grouped:{op}", GemmConstraints(**_GEMM, formats=("fp8_e4m3",), fp8_mma=True),
                    options=(("mma", "fp8"),)),
        _NativeGemm(op, "cupy", f"cupy.grouped:{op}", GemmConstraints(**_GEMM, formats=("int8",), int8_mma=True),
                    options=(("mma", "int8"),)),
        Impl(op, "cupy", f"cupy.grouped:{op}", GemmConstraints(**_GEMM, max_cc=(8, 9), formats=("fp8_e4m3",)),
             variant="w8a16", fallback="FP8 expanded exactly to fp16, fp16 tensor-core MMA with fp32 accumulation",
             options=(("mma", "fp16"),)),
    )),
    # Routing (routing.cu): integer sort and the shared quantizer's numerics, on every supported GPU.
    *(Impl(op, "cupy", f"cupy.routing:{op}", Constraints(**_BASE)) for op in ("moe_permute", "moe_permute_masked")),
    Impl("moe_unpermute", "cupy", "cupy.routing:moe_unpermute",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32"))),
)
