"""The torch reference backend: every op, on any device torch runs on, computing the numerics contract
exactly. It is the last entry of every priority list and the oracle of the parity tests.

Its functions run under `torch.no_grad()`: like the Triton and CuPy backends' outputs (fresh
`torch.empty` buffers), its outputs never join the inputs' autograd graph; gradients are recorded
above the backends, by the custom ops (`quantcore/gradients.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...registry.impl import REDUCED_FP8_ACCUMULATION, Constraints, GemmConstraints, Impl
from .bf16_dequant import NUMERICS as BF16_DEQUANT, vendor_gemm_reasons
from .epilogue import dequant_bias, quantized_gelu
from .gemm import quant_linear, scaled_mm
from .producers import rms_norm_quant, silu_mul_quant
from .grouped import grouped_mm, grouped_mm_masked
from .quant import act_dequant, act_quant, weight_dequant, weight_quant
from .routing import moe_permute, moe_permute_masked, moe_unpermute

if TYPE_CHECKING:
    from ...definitions.query import Query


class _VendorBf16Gemm(Impl):
    """A GEMM on torch's bf16 matmul with an fp32 result, which CUDA builds of torch have from 2.8."""

    def not_supported_reasons(self, query: Query) -> list[str]:
        return super().not_supported_reasons(query) + vendor_gemm_reasons(query.profile.kind)


OPS = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "scaled_mm", "quant_linear", "quantized_gelu",
       "rms_norm_quant", "silu_mul_quant")
# Mixture of experts: the grouped GEMMs loop over the experts' scaled_mm (the oracle of the grouped kernels).
MOE_OPS = ("grouped_mm", "grouped_mm_masked", "moe_permute", "moe_permute_masked")
_ANYWHERE = Constraints(devices=("cpu", "cuda"))

IMPLS = (
    *(Impl(op, "torch", f"torch:{op}", _ANYWHERE) for op in (*OPS, *MOE_OPS)),
    Impl("dequant_bias", "torch", "torch:dequant_bias",
         Constraints(devices=("cpu", "cuda"), formats=("bfloat16", "float16", "float32", "int32"))),
    Impl("moe_unpermute", "torch", "torch:moe_unpermute",
         Constraints(devices=("cpu", "cuda"), formats=("bfloat16", "float16", "float32"))),
    # cuBLAS's block-wise FP8 GEMM: torch enables it on sm_90 only, for 128x128 blocks, 16-aligned N, K in
    # groups of four K blocks (torch.cublas).
    Impl("scaled_mm", "torch", "torch.cublas:scaled_mm",
         GemmConstraints(min_cc=(9, 0), max_cc=(10, 0), formats=("fp8_e4m3",), fp8_mma=True, block_sizes=(128,),
                         nk_multiple=(16, 512)),
         variant="cublas", numerics=REDUCED_FP8_ACCUMULATION, separate_epilogue=True),
    # Opt-in: operands dequantized to bf16 for the vendor's bf16 GEMM, on any GPU and the CPU
    # (bf16_dequant.py, docs/numerics.md); never chosen automatically.
    *(_VendorBf16Gemm(op, "torch", f"torch.bf16_dequant:{op}", GemmConstraints(devices=("cpu", "cuda")),
                      variant="bf16_dequant", numerics=BF16_DEQUANT, opt_in=True)
      for op in ("scaled_mm", "quant_linear")),
)

__all__ = ["IMPLS", "act_quant", "act_dequant", "weight_quant", "weight_dequant", "scaled_mm", "quant_linear",
           "dequant_bias", "quantized_gelu", "rms_norm_quant", "silu_mul_quant", "grouped_mm", "grouped_mm_masked",
           "moe_permute", "moe_permute_masked", "moe_unpermute"]
