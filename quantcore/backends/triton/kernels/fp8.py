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
    """e4m3fn bits -> fp32, exactly: the conversion instruction when HW (sm_89+), else the fp16 route."""
    if HW:
        return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return fp8e4m3_decode_f16(bits).to(tl.float32)


@triton.jit
def fp8e4m3_decode_f16(bits):
    """e4m3fn bits (uint8) -> fp16, exactly: every e4m3 value, subnormals included, is an fp16 value.

    fp16 rather than bf16 because the interpreter's `tl.dot` multiplies bf16 tensors as raw
    integers, and fp16 MMA is as fast as bf16 MMA on every GPU that lacks FP8 MMA.
    """
    b = bits.to(tl.int16)
    mag = b & 0x7F
    # Placing the 7 magnitude bits in fp16's exponent/mantissa field gives the value times 2**-8
    # (exponent biases 7 vs 15) for normals and subnormals alike; 0x7E00 is an fp16 NaN.
    h = tl.where(mag == 0x7F, 0x7E00, mag << 7) | ((b & 0x80) << 8)
    return h.to(tl.float16, bitcast=True) * 256.0


@triton.jit
def nan_absmax(x, axis: tl.constexpr):
    """max |x| of an fp32 tensor along `axis`: NaN if any element is NaN, else +Inf if any is infinite."""
    # Sign-cleared fp32 patterns order like |x| with every NaN above +Inf, so an integer max
    # propagates NaN, which tl.max on floats does not reliably do.
    bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return tl.max(bits, axis=axis).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_round_up(s):
    """Round positive fp32 scales up to a normal power of two on their bits (a subnormal becomes
    2^-126, as in the reference's `round_scale_ue8m0`); NaN and Inf pass through."""
    bits = s.to(tl.int32, bitcast=True)
    exp = bits & 0x7F800000
    up = tl.where((bits & 0x7FFFFF) != 0, exp + 0x800000, exp)
    return tl.where(exp == 0x7F800000, s, up.to(tl.float32, bitcast=True))
