"""FP8 e4m3fn codec and block-scale helpers, written as integer arithmetic on fp32 bits.

Triton refuses to compile a kernel that names the fp8e4nv type below sm_89, and the interpreter's
own fp32 -> fp8 cast mis-rounds when the rounding carries into the exponent. So FP8 data crosses
every kernel boundary as uint8 bits and is encoded/decoded here, bit-exactly on any GPU and in the
interpreter alike. On GPUs with FP8 hardware (HW true, sm_89+) the conversion instructions compute
the same codes (`cvt.rn.satfinite`: nearest even, ±448 on overflow, NaN kept) at a fraction of the
integer arithmetic's cost, which made FP8 quantization compute-bound (measured on an H100).
"""

import triton
import triton.language as tl

from ....capability import triton_interpreter

# Whether kernels decode FP8 with the packed PTX below: compiled kernels do; the interpreter runs no
# inline assembly. Fixed at import, as Triton fixes at @jit time whether kernels are interpreted; a
# global constexpr is part of every kernel's cache key.
PACKED_DECODE = tl.constexpr(not triton_interpreter())

# e4m3fn -> fp16 for 4 codes in one 32-bit register (byte i = code i) into two registers of fp16
# pairs (code i in half i), in 11 instructions where the integer route takes ~10 per code: each code's 7 magnitude bits go to fp16 bits
# 7-13 and its sign to bit 15, which is the value times 2**-8 (exponent bias 7 vs 15, subnormals
# included), then one exact fp16 multiply by 2**8. A NaN code (magnitude 0x7F) also gets bit 14,
# making the exponent all ones: 0x7F80 | sign, an fp16 NaN. Valid PTX for sm_75 and later.
_PACKED_F16 = tl.constexpr("""{
.reg .b32 m, n, c, s, lo, hi, k;
and.b32 m, $2, 0x7F7F7F7F;          // magnitudes
add.u32 n, m, 0x01010101;           // bit 7 of a byte set iff its magnitude is 0x7F (no carries)
lop3.b32 c, m, n, 0x80808080, 0xF8; // c = m | (n & 0x80808080): magnitude, NaN flag in bit 7
shr.b32 s, $2, 7;
and.b32 s, s, 0x01010101;           // sign of each code in bit 0 of its byte
prmt.b32 lo, c, s, 0x5140;          // bytes c0 s0 c1 s1
prmt.b32 hi, c, s, 0x7362;          // bytes c2 s2 c3 s3
shl.b32 lo, lo, 7;                  // c0 to bits 7-14, s0 to 15; c1 to 23-30, s1 to 31
shl.b32 hi, hi, 7;
mov.b32 k, 0x5C005C00;              // fp16 256.0 twice
mul.rn.f16x2 $0, lo, k;
mul.rn.f16x2 $1, hi, k;
}""")


@triton.jit
def fp8e4m3_encode(v):
    """fp32 tensor -> e4m3fn bits (uint8): round to nearest even, saturate to ±448, NaN -> 0x7F | sign.

    Matches `v.clamp(-448, 448).to(torch.float8_e4m3fn)` bit for bit, signed zeros included.
    """
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    # Non-negative fp32 bit patterns order like their values, so an integer clamp to 448.0's
    # pattern saturates finite overflow and +Inf alike (NaN is restored below).
    mag = tl.minimum(bits & 0x7FFFFFFF, 0x43E00000)
    exp = mag >> 23
    # Normal range (|v| >= 2**-6): drop 20 mantissa bits, ties to even, then rebias 127 -> 7.
    normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - (120 << 3)
    # Below 2**-6 the code is |v| in units of 2**-9: the 24-bit significand shifted right by
    # 141 - exp. The clamp to 31 keeps the shift defined; it already yields 0 there.
    shift = tl.minimum(141 - exp, 31)
    sig = (mag & 0x7FFFFF) | 0x800000
    sub = sig >> shift
    rem = sig - (sub << shift)
    half = 1 << (shift - 1)
    sub += ((rem > half) | ((rem == half) & ((sub & 1) == 1))).to(tl.int32)
    code = tl.where(exp >= 121, normal, sub)
    code = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7F, code)
    return (code | sign).to(tl.uint8)


@triton.jit
def fp8e4m3_encode_as(v, HW: tl.constexpr):
    """fp32 -> e4m3fn bits: the conversion instruction when HW (sm_89+), else `fp8e4m3_encode`."""
    if HW:
        return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        return fp8e4m3_encode(v)


@triton.jit
def fp8e4m3_decode_f32(bits, HW: tl.constexpr):
    """e4m3fn bits -> fp32, exactly: the conversion instruction when HW (sm_89+), else the fp16 route
    one code per lane. The packed route needs 4 codes per thread, which the memory-bound kernels'
    small tiles do not always give (Triton refuses to compile it then: a 5×1 act_dequant on the H100
    under simulate("sm80")), and these kernels are bound by memory, not by the decode."""
    if HW:
        return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return fp8e4m3_decode_f16_lanes(bits).to(tl.float32)


@triton.jit
def fp8e4m3_decode_f16(bits):
    """e4m3fn bits (uint8) -> fp16, exactly: every e4m3 value, subnormals included, is an fp16 value.

    fp16 rather than bf16 because the interpreter's `tl.dot` multiplies bf16 tensors as raw
    integers, and fp16 MMA is as fast as bf16 MMA on every GPU that lacks FP8 MMA. Compiled kernels
    decode four codes per 32-bit register, the interpreter one code per lane: the same value for
    every code (an fp16 NaN for a NaN code).
    """
    if PACKED_DECODE:
        return fp8e4m3_decode_f16_packed(bits)
    else:
        return fp8e4m3_decode_f16_lanes(bits)


@triton.jit
def fp8e4m3_decode_f16_packed(bits):
    """`fp8e4m3_decode_f16` in the packed PTX `_PACKED_F16` (compiled kernels only)."""
    # Declared impure so that Triton does not move the GEMMs' conversions to MMA operand layout
    # above it (it moves them over pure element-wise code, back to the shared-memory load): the
    # tile is then decoded once, in the layout it was loaded in, and staged as fp16 in shared
    # memory, instead of once per MMA fragment by every warp that reads it (2-4 times on sm_80
    # tiles). Checked in the TTGIR of Triton 3.6 for sm_80 and sm_90.
    return tl.inline_asm_elementwise(_PACKED_F16, "=r,=r,r", [bits], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def fp8e4m3_decode_f16_lanes(bits):
    """`fp8e4m3_decode_f16` in integer arithmetic, one code per lane (any GPU and the interpreter)."""
    b = bits.to(tl.int16)
    mag = b & 0x7F
    # Placing the 7 magnitude bits in fp16's exponent/mantissa field gives the value times 2**-8
    # (exponent biases 7 vs 15) for normals and subnormals alike; 0x7E00 is an fp16 NaN.
    h = tl.where(mag == 0x7F, 0x7E00, mag << 7) | ((b & 0x80) << 8)
    return h.to(tl.float16, bitcast=True) * 256.0


@triton.jit
def nan_maximum(a, b):
    """max(a, b) of fp32 tensors, NaN where either is: `max.NaN` (sm_80+), where tl.max's combine drops NaN."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nan_absmax(x, axis: tl.constexpr):
    """max |x| of an fp32 tensor along `axis`: NaN if any element is NaN, else +Inf if any is infinite.
    One instruction an element on sm_90 (the absolute value folds into FMNMX.NAN), where an integer
    maximum of the sign-cleared bits took two; maxima of several parts combine with `nan_maximum`."""
    return tl.reduce(tl.abs(x), axis, nan_maximum)


@triton.jit
def ue8m0_round_up(s):
    """Round positive fp32 scales up to a normal power of two on their bits (a subnormal becomes
    2^-126, as in the reference's `round_scale_ue8m0`); NaN and Inf pass through."""
    bits = s.to(tl.int32, bitcast=True)
    exp = bits & 0x7F800000
    up = tl.where((bits & 0x7FFFFF) != 0, exp + 0x800000, exp)
    return tl.where(exp == 0x7F800000, s, up.to(tl.float32, bitcast=True))
