"""The Triton backend: every op as Triton kernels (`kernels/`), launched through `launch.py`.

FP8 tensors reach kernels as uint8 bits and are encoded/decoded with integer arithmetic, so every
kernel also compiles below sm_89, where Triton refuses the fp8e4nv type; only the GEMM names that
type, behind a compile-time switch taken when the device has FP8 tensor cores. Without them the
GEMM decodes FP8 exactly to fp16 and runs fp16 MMA with fp32 accumulation: the `w8a16` variant.
Each GEMM variant passes its MMA kind to the launch as the `mma` option ("int8", "fp8", "fp16": the
kinds `configs.py` keys tiles on), so that what the registry chose is what runs, whatever the profile.
The `gluon` variant is a kernel of its own for sm_90 (`kernels/gluon_gemm.py`, warp-specialized, in
Triton's Gluon), launched by `gluon_launch.py` where a call or a measured priority names it (`gluon.py`
says where it can run).
"""

from __future__ import annotations

from ...registry.impl import REDUCED_FP8_ACCUMULATION, Constraints, GemmConstraints, Impl
from .gluon import TILE_N, GluonConstraints

_MEMORY_BOUND = ("act_quant", "act_dequant", "weight_quant", "weight_dequant", "quantized_gelu")
_BASE = dict(min_cc=(8, 0), requires=("triton",), interpreter=True)
# The K block is the GEMM's K tile (a power of two for tl.arange; up to 256, whose 128x256-byte A and B
# tiles fit one pipeline stage in every sm_80+ GPU's shared memory); a re-quantize group fits one N tile.
_GEMM = dict(_BASE, block_k_multiple=16, block_k_pow2=True, block_k_max=256, out_group_max=256)
# 8-bit operands on the tensor cores: the MMA's k is 32 for them, and tl.dot refuses a smaller K tile when it
# compiles for the GPU (the interpreter does not), so a K block of 16 is for FP8 decoded to fp16 only.
_MMA8 = dict(_GEMM, block_k_multiple=32)
# The Gluon kernel (kernels/gluon_gemm.py): K blocks of 32 to 128 (wgmma's k is 32 for 8-bit operands;
# a 128-byte row is the widest TMA box with 128-byte swizzling); a re-quantize group fits its N tile.
_GLUON = dict(min_cc=(9, 0), requires=("triton",), fp8_mma=True, int8_mma=True, block_k_multiple=32,
              block_k_pow2=True, block_k_max=128, out_group_max=TILE_N)
# FP8 tl.dot on Hopper accumulates at reduced precision (base.REDUCED_FP8_ACCUMULATION); promoting to
# fp32 every 32 products (max_num_imprecise_acc=32) measured 4.5e-5 and 26% slower, so not taken.

IMPLS = (
    *(Impl(op, "triton", f"triton.launch:{op}", Constraints(**_BASE)) for op in _MEMORY_BOUND),
    *(Impl(op, "triton", f"triton.producers:{op}", Constraints(**_BASE))
      for op in ("rms_norm_quant", "silu_mul_quant")),
    Impl("dequant_bias", "triton", "triton.launch:dequant_bias",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32", "int32"))),
    # quant_linear runs the GEMM's kernels (its activation quantized in their prologue): the same variants.
    *(impl for op in ("scaled_mm", "quant_linear") for impl in (
        Impl(op, "triton", f"triton.launch:{op}", GemmConstraints(**_MMA8, formats=("int8",), int8_mma=True),
             options=(("mma", "int8"),)),
        Impl(op, "triton", f"triton.launch:{op}", GemmConstraints(**_MMA8, formats=("fp8_e4m3",), fp8_mma=True),
             numerics=REDUCED_FP8_ACCUMULATION, options=(("mma", "fp8"),)),
        Impl(op, "triton", f"triton.launch:{op}", GemmConstraints(**_GEMM, formats=("fp8_e4m3",), max_cc=(8, 9)),
             variant="w8a16", fallback="FP8 decoded exactly to fp16, fp16 tensor-core MMA with fp32 accumulation",
             options=(("mma", "fp16"),)),
    )),
    # The grouped (mixture-of-experts) GEMMs run the tiled GEMM's program per expert: its variants and tiles.
    *(impl for op in ("grouped_mm", "grouped_mm_masked") for impl in (
        Impl(op, "triton", f"triton.grouped:{op}", GemmConstraints(**_MMA8, formats=("int8",), int8_mma=True),
             options=(("mma", "int8"),)),
        Impl(op, "triton", f"triton.grouped:{op}", GemmConstraints(**_MMA8, formats=("fp8_e4m3",), fp8_mma=True),
             numerics=REDUCED_FP8_ACCUMULATION, options=(("mma", "fp8"),)),
        Impl(op, "triton", f"triton.grouped:{op}", GemmConstraints(**_GEMM, formats=("fp8_e4m3",), max_cc=(8, 9)),
             variant="w8a16", fallback="FP8 decoded exactly to fp16, fp16 tensor-core MMA with fp32 accumulation",
             options=(("mma", "fp16"),)),
    )),
    # Routing: integer sort and the shared quantizer (FP8 encoded on its bits, so no FP8 hardware needed).
    *(Impl(op, "triton", f"triton.routing:{op}", Constraints(**_BASE)) for op in ("moe_permute", "moe_permute_masked")),
    Impl("moe_unpermute", "triton", "triton.routing:moe_unpermute",
         Constraints(**_BASE, formats=("bfloat16", "float16", "float32"))),
    # The Gluon variant on sm_90 (`triton[gluon]`): registered after the tiled kernels, which take every
    # call it takes, so that "triton" in a priority never reaches it; it runs where a call names it or a
    # measured priority table lists it, and the bench times it under its own label to write such tables.
    # Its grouped GEMM is the contiguous (prefill) layout's: the masked one's decode-sized rows fill no
    # 128-row tile.
    *(Impl(op, "triton", f"triton.gluon_launch:{op}", GluonConstraints(**_GLUON, formats=(fmt,)), variant="gluon",
           numerics=numerics, compared_alone=True)
      for op in ("scaled_mm", "quant_linear", "grouped_mm")
      for fmt, numerics in (("int8", "exact"), ("fp8_e4m3", REDUCED_FP8_ACCUMULATION))),
)
