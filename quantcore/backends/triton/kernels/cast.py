"""Loads into fp32 and stores from fp32 for every float/int element kind a kernel meets.

Kinds are compile-time strings: "fp32", "fp16", "bf16", "int32". bf16 tensors reach kernels as
int16 views and are converted here on their bits: the interpreter's bf16 casts truncate instead
of rounding to nearest even, and the bit route is as cheap as a cast on the GPU.
"""

import triton
import triton.language as tl

from ....capability import triton_interpreter

# Whether kernels round fp32 to bf16 with the conversion instruction (compiled: cvt.rn.bf16.f32, nearest even)
# rather than on the bits (`bf16_encode`, which the interpreter needs: its cast truncates). Fixed at import,
# as `epilogue.PTX_MATH` is.
HW_BF16 = tl.constexpr(not triton_interpreter())


@triton.jit
def bf16_encode(x):
    """fp32 -> bf16 bits (int16), round to nearest even; NaN -> 0x7FC0 as torch's scalar CPU cast gives it (its
    vectorized cast may give 0xFFFF)."""
    bits = x.to(tl.int32, bitcast=True)
    # Adding 0x7FFF plus the kept LSB and shifting is RNE on the magnitude; a carry into the
    # exponent is the correct round-up (to Inf past the largest bf16). Arithmetic >> keeps the sign.
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, r).to(tl.int16)


@triton.jit
def to_f32(x, KIND: tl.constexpr):
    """Elements of kind KIND as loaded (bf16 as int16 bits) converted to fp32 exactly (int32: RNE)."""
    if KIND == "bf16":
        return (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def load_f32(ptrs, mask, KIND: tl.constexpr):
    """Load elements of kind KIND (masked lanes read 0) and convert them to fp32 exactly (int32: RNE)."""
    return to_f32(tl.load(ptrs, mask=mask, other=0), KIND)


@triton.jit
def store_f32_as(ptrs, x, mask, KIND: tl.constexpr):
    """Store fp32 `x` as KIND ("fp32", "fp16" or "bf16"), rounding to nearest even."""
    if KIND == "bf16":
        tl.store(ptrs, bf16_encode(x), mask=mask)
    else:
        tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def round_to(x, KIND: tl.constexpr):
    """fp32 `x` rounded to nearest even in KIND ("fp32", "fp16", "bf16") and back to fp32, exactly: where a
    computation written in KIND would round (the norm's x·rstd, rounded to the input's dtype). Compiled, one
    conversion instruction each way: the bit route takes about eleven, and the fused norm rounds twice an
    element, where instruction issue, not memory, bounds it."""
    if KIND == "bf16":
        if HW_BF16:
            return x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.float32)
        else:
            return to_f32(bf16_encode(x), "bf16")
    elif KIND == "fp16":
        return x.to(tl.float16, fp_downcast_rounding="rtne").to(tl.float32)
    else:
        return x
