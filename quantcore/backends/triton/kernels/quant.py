"""Block quantize / dequantize: one kernel each for activations (1×G blocks) and weights (Bn×Bk).

Both view their program's tile as 4-D [RB, BR_PAD, CB, BC_PAD]: RB × CB whole scale blocks of
BR × BC elements (padded to powers of two and masked), so that a block's amax is a reduction over
axes 3 and 1 and every block size, tail and stride is handled by the same code. Activations are
BR = 1 with several rows per program; weights are BR = Bn.
"""

import torch
import triton
import triton.language as tl

from ....formats import format_of_dtype

from .cast import load_f32, store_f32_as
from .epilogue import PTX_MATH, activate, rcp_approx
from .fp8 import fp8e4m3_decode_f16, fp8e4m3_decode_f32, fp8e4m3_encode_as, nan_absmax, ue8m0_round_up


# Two fp32 quotients ($1, $2) -> their INT8 codes packed in the low 16 bits ($1's in the low byte): each rounded
# half to even by `cvt.rni` (0 for NaN), saturated and packed by `cvt.pack.sat`, which ptxas for sm_90a fuses into
# one F2IP a pair (packed, d = c << 16 | sat(a) << 8 | sat(b)).
_INT8X2 = tl.constexpr("""{
.reg .s32 a, b;
.reg .b32 d;
cvt.rni.s32.f32 a, $1;
cvt.rni.s32.f32 b, $2;
cvt.pack.sat.s8.s32.b32 d, b, a, 0;
cvt.u16.u32 $0, d;
}""")


# The packed conversion takes a thread's elements in pairs, so it needs an even count of them in every thread: a
# tensor's elements (a power of two) spread over a CTA's threads (at most 1024) are, from 2048 of them.
PAIRED_MIN = tl.constexpr(2048)


@triton.jit
def int8_encode(v, HW: tl.constexpr):
    """fp32 quotients of `divide` -> int8: round half to even, NaN -> 0. No clamp is needed: a group's scale is
    at least its amax / 127, so |v| is at most 127·(1 + 2^-23) and rounds to at most 127.

    HW (compiled for sm_89+) and at least PAIRED_MIN elements: two codes an instruction (`_INT8X2`), where the
    float route below takes two float instructions a code and a byte permute a pair (measured faster on the H100).
    Else two float instructions and no inline assembly, the route the interpreter runs (`cvt.rni`, one code an
    instruction, was no faster than it)."""
    if HW and v.numel >= PAIRED_MIN:
        return tl.inline_asm_elementwise(_INT8X2, "=h,r,r", [v], dtype=tl.int8, is_pure=True, pack=2)
    else:
        # v + 1.5·2^23 lies in [2^23, 2^24), where the ulp is 1: the FPU rounds v half to even and the sum's
        # low bits hold it in two's complement. A NaN sum becomes 1.5·2^23 − 256 (tl.maximum returns the
        # number), whose low byte is 0.
        w = tl.maximum(v + 12582912.0, 12582656.0)
        return w.to(tl.int32, bitcast=True).to(tl.int8)


@triton.jit
def decode_f32(codes, QFMT: tl.constexpr, HW_FP8: tl.constexpr):
    """Quantized codes (uint8 e4m3 bits or int8) -> fp32, exactly (HW_FP8: sm_89+ instructions)."""
    if QFMT == "fp8":
        return fp8e4m3_decode_f32(codes, HW_FP8)
    else:
        return codes.to(tl.float32)


# RN(1/qmax) in fp32 for `block_scale`'s division by qmax (torch's fp32 division rounds once; the literal is
# exactly that fp32 value, so the kernels' constant is it too).
QMAX_RCP_FP8 = tl.constexpr(float(torch.tensor(1.0) / 448.0))
QMAX_RCP_INT8 = tl.constexpr(float(torch.tensor(1.0) / 127.0))
FP32_MAX = tl.constexpr(float(torch.finfo(torch.float32).max))


@triton.jit
def block_scale(amax, eps, QFMT: tl.constexpr, UE8M0: tl.constexpr, TINY_SCALES: tl.constexpr = True):
    """scale = max(amax, eps) / qmax with IEEE division, optionally rounded up to a power of two. TINY_SCALES
    off: eps is at least qmax·2^-63 (`scales_may_be_tiny` is False), so every quotient is a normal number."""
    qmax = 448.0 if QFMT == "fp8" else 127.0
    # A NaN amax fails the comparison and stays NaN, where tl.maximum would return eps.
    floored = tl.where(amax < eps, eps, amax)
    if TINY_SCALES:
        # tl.div_rn takes no scalar, and under Gluon tl.full makes no tensor (it needs a layout): a select
        # makes qmax a tensor shaped and laid out like `floored`.
        s = tl.div_rn(floored, tl.where(True, qmax, floored))
    else:
        # The division by a known divisor of `divide`, its reciprocal a constant: exact while the quotient is
        # normal. tl.div_rn compiles to these steps (its reciprocal refined from a constant, each time) plus a
        # range check and a branch to a slow path: per row and group in the GEMMs' re-quantized epilogues,
        # between the amax and the quotients, where the branches keep ptxas from interleaving the rows.
        s = correct_quotient(floored, qmax, QMAX_RCP_FP8 if QFMT == "fp8" else QMAX_RCP_INT8)
        # +Inf: its remainder, Inf − Inf, is NaN, where IEEE division gives +Inf.
        s = tl.where(floored > FP32_MAX, floored, s)
    if UE8M0:
        s = ue8m0_round_up(s)
    return s


@triton.jit
def reciprocal(s):
    """RN(1/s) for fp32 s, a quantizer's scale as `divide` takes its reciprocal: positive and normal below
    2^123 (ue8m0 scales, at least 2^-126, and the others after its rescaling), +Inf (0) or NaN (NaN). Compiled:
    an approximate reciprocal, a Newton step and Markstein's final step, the steps `tl.div_rn` takes where its
    range check passes, which it always does here; without that check and its branch to a slow path, which kept
    ptxas from interleaving a thread's rows in the GEMMs' re-quantized epilogues. tests/gpu/test_quantize_division.py
    compares it with `tl.div_rn` on every positive normal fp32 below 2^123, +Inf and NaN."""
    if PTX_MATH:
        r = rcp_approx(s)
        # +Inf: the approximate reciprocal is 0, and taken as s = 0 the steps keep it (Inf · 0 would be NaN).
        s = tl.where(r == 0.0, 0.0, s)
        r = tl.fma(tl.fma(s * -1.0, r, 1.0), r, r)
        return tl.fma(tl.fma(s * -1.0, r, 1.0), r, r)
    else:
        return tl.div_rn(tl.where(True, 1.0, s), s)


# `divide` rescales where a scale lies below this: its reciprocal would overflow near the smallest subnormal.
TINY_SCALE = tl.constexpr(2.0 ** -64)


def scales_may_be_tiny(eps: float, dtype: torch.dtype | None) -> bool:
    """Whether quantizing to `dtype` (a quantized format's, else no quantization: False) with scales floored
    at eps (at least eps / qmax, rounded) can give a scale below TINY_SCALE; a factor of two to spare covers
    fp32's rounding of eps and of the quotient. Where it cannot (eps ≥ about 2.5e-17 in FP8, 6.9e-18 in
    INT8: the default 1e-4 included), a kernel compiles `divide` with TINY_SCALES off."""
    fmt = format_of_dtype(dtype)
    return fmt is not None and eps < fmt.qmax * TINY_SCALE.value * 2.0


@triton.jit
def correct_quotient(x, s, r):
    """RN(x / s) from r = RN(1/s) (`divide`'s steps, Markstein): q0 = RN(x·r), the remainder exactly by an FMA,
    one correction; x, s and r alike in shape, or scalars."""
    q0 = x * r
    # The remainder negated, s·q0 − x, and added times −r: a zero quotient then keeps x's sign (x − s·q0
    # is +0 for x = −0, and −0 + (+0)·r would be +0). Negated by multiplying by −1: a sign flip that folds
    # into the FMA's operand, where Triton 3.6's unary minus gave +0 for −(+0) on the GPU
    # (tests/gpu/test_quantize_division.py caught it; the interpreter's flips the sign).
    neg_rem = tl.fma(s, q0, x * -1.0)
    return tl.fma(neg_rem, r * -1.0, q0)


@triton.jit
def divide(x, scale, POW2: tl.constexpr, TINY_SCALES: tl.constexpr = True):
    """x / scale rounded as IEEE division rounds, for the quantizers: `scale` one per group (positive, or NaN
    / +Inf for a group holding one), shaped to broadcast to x's, |x| at most about qmax·scale. POW2: every
    scale is a power of two (ue8m0). TINY_SCALES off: no scale lies below TINY_SCALE (`scales_may_be_tiny`),
    and the rescaling below is left out.

    Division by a divisor known per group (Markstein; J.-M. Muller, "Accelerating floating-point division
    when the divisor is known in advance", 2002): r = RN(1/s) once per group, then per element
    q0 = RN(x·r), the remainder x − s·q0 exactly by an FMA, and RN(q0 + remainder·r) = RN(x/s), as r is
    within half an ulp of 1/s and q0 within one ulp of x/s. Three instructions an element (four with
    TINY_SCALES) where `tl.div_rn` takes about eleven and a branch to its slow path (ptxas for sm_90a).
    Where the remainder would be inexact (below 2^-126: |x| under about 2^-102 after the scaling below), the
    quotient is under 2^-17 and its code ±0 either way. tests/gpu/test_quantize_division.py compares it
    with `tl.div_rn` (and the interpreter's tests with the reference's division)."""
    if POW2:
        # A power of two (a normal one: ue8m0 scales are at least 2^-126) has an exact reciprocal, so x·(1/s)
        # is x/s rounded once, as the division rounds it (and ±0 or NaN where s is +Inf): one product an element.
        return x * tl.broadcast_to(reciprocal(scale), x.shape)
    s = scale
    if TINY_SCALES:
        # A scale below 2^-64 (eps allows down to the smallest subnormal, whose reciprocal overflows) is
        # divided into as one 2^64 times larger, its group's values scaled alike: both exactly.
        f = tl.where(scale < TINY_SCALE, 18446744073709551616.0, 1.0)
        s = scale * f
        x = x * tl.broadcast_to(f, x.shape)
    r = reciprocal(s)
    # An infinite scale has r = 0: taken as s = 0 in the remainder, the result is q0 = x·0, which is ±0 for
    # finite x and NaN for ±Inf, as IEEE division by +Inf gives.
    s = tl.where(r == 0.0, 0.0, s)
    return correct_quotient(x, tl.broadcast_to(s, x.shape), tl.broadcast_to(r, x.shape))


@triton.jit
def quantize(x, scale, QFMT: tl.constexpr, HW_FP8: tl.constexpr, UE8M0: tl.constexpr,
             TINY_SCALES: tl.constexpr = True):
    """Codes in QFMT of `divide(x, scale, UE8M0, TINY_SCALES)` (HW_FP8: sm_89+ conversion instructions;
    UE8M0: the scales are powers of two)."""
    v = divide(x, scale, UE8M0, TINY_SCALES)
    if QFMT == "fp8":
        return fp8e4m3_encode_as(v, HW_FP8)
    else:
        return int8_encode(v, HW_FP8)


@triton.jit
def group_quantize(x, eps, GROUP: tl.constexpr, QFMT: tl.constexpr, UE8M0: tl.constexpr, HW_FP8: tl.constexpr,
                   TINY_SCALES: tl.constexpr = True):
    """x [R, C] fp32 quantized per 1×GROUP block of its rows (GROUP divides C) -> (codes [R, C] in QFMT,
    scales [R, C // GROUP] fp32): the GEMMs' re-quantized output, in Triton's and Gluon's kernels alike."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    x = tl.reshape(x, (R, C // GROUP, GROUP))
    scale = block_scale(nan_absmax(x, 2), eps, QFMT, UE8M0, TINY_SCALES)
    q = quantize(x, scale[:, :, None], QFMT, HW_FP8, UE8M0, TINY_SCALES)
    return tl.reshape(q, (R, C)), scale


@triton.jit
def block_tile(R, C, BR: tl.constexpr, BC: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr,
               BR_PAD: tl.constexpr, BC_PAD: tl.constexpr, EVEN: tl.constexpr):
    """This program's element rows/cols [RB, BR_PAD, CB, BC_PAD] with their mask, and its scale
    rows [RB, 1] / cols [1, CB] with theirs. EVEN: every program holds whole, unpadded blocks
    inside the tensor (the launch checked), so the masks are constants the compiler removes, and
    with them four compares per element (measured: the quantize kernels are near compute-bound)."""
    srow = tl.program_id(0) * RB + tl.arange(0, RB)
    scol = tl.program_id(1) * CB + tl.arange(0, CB)
    j = tl.arange(0, BR_PAD)
    p = tl.arange(0, BC_PAD)
    rows = srow[:, None, None, None] * BR + j[None, :, None, None]
    cols = scol[None, None, :, None] * BC + p[None, None, None, :]
    if EVEN:
        mask = tl.full((RB, BR_PAD, CB, BC_PAD), 1, tl.int1)
        smask = tl.full((RB, CB), 1, tl.int1)
    else:
        mask = (rows < R) & (cols < C) & (j[None, :, None, None] < BR) & (p[None, None, None, :] < BC)
        smask = (srow[:, None] < tl.cdiv(R, BR)) & (scol[None, :] < tl.cdiv(C, BC))
    return rows, cols, mask, srow[:, None], scol[None, :], smask


@triton.jit
def block_quant_kernel(src_ptr, src_scale_ptr, q_ptr, scale_ptr, R, C,
                       stride_src, stride_src_sr, stride_src_sc, stride_q, stride_sr, stride_sc, eps,
                       BR: tl.constexpr, BC: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr,
                       BR_PAD: tl.constexpr, BC_PAD: tl.constexpr, SRC: tl.constexpr,
                       QFMT: tl.constexpr, UE8M0: tl.constexpr, ACTIVATION: tl.constexpr,
                       HW_FP8: tl.constexpr, EVEN: tl.constexpr):
    """Quantize src [R, C] per BR×BC block into codes q (QFMT) and fp32 scales [ceil(R/BR), ceil(C/BC)].

    SRC is the source kind: a float kind ("fp32", "fp16", "bf16") for act/weight quantize, or a
    quantized format ("fp8", "int8") whose per-block scales src_scale dequantize it first (quantized
    GELU, same block grid). ACTIVATION is applied in fp32 before re-quantizing. HW_FP8 (sm_89+)
    converts FP8 with the hardware instructions.
    """
    rows, cols, mask, srow, scol, smask = block_tile(R, C, BR, BC, RB, CB, BR_PAD, BC_PAD, EVEN)
    if SRC == "fp8" or SRC == "int8":
        codes = tl.load(src_ptr + rows * stride_src + cols, mask=mask, other=0)
        s_in = tl.load(src_scale_ptr + srow * stride_src_sr + scol * stride_src_sc, mask=smask, other=1.0)
        x = decode_f32(codes, SRC, HW_FP8) * s_in[:, None, :, None]
    else:
        x = load_f32(src_ptr + rows * stride_src + cols, mask, SRC)
    # Masked lanes must not reach the amax (a dequantized 0 * Inf scale would be NaN).
    x = tl.where(mask, activate(x, ACTIVATION), 0.0)
    store_quantized(x, rows, cols, mask, srow, scol, smask, q_ptr, stride_q, scale_ptr, stride_sr, stride_sc, eps,
                    QFMT, UE8M0, HW_FP8)


@triton.jit
def store_quantized(x, rows, cols, mask, srow, scol, smask, q_ptr, stride_q, scale_ptr, stride_sr, stride_sc, eps,
                    QFMT: tl.constexpr, UE8M0: tl.constexpr, HW_FP8: tl.constexpr, TINY_SCALES: tl.constexpr = True):
    """Quantize a `block_tile` tile x [RB, BR_PAD, CB, BC_PAD] (fp32, 0 outside `mask`) per block, act_quant's
    formulas, and store its codes at q_ptr + rows·stride_q + cols and its scales at
    scale_ptr + srow·stride_sr + scol·stride_sc: what every kernel writing quantized blocks ends with (the
    block quantizer above, the fused producers of `producers.py`). TINY_SCALES off where eps rules out
    scales below TINY_SCALE (`scales_may_be_tiny`): the same bits, an instruction an element fewer."""
    scale = block_scale(nan_absmax(nan_absmax(x, 3), 1), eps, QFMT, UE8M0, TINY_SCALES)
    q = quantize(x, scale[:, None, :, None], QFMT, HW_FP8, UE8M0, TINY_SCALES)
    tl.store(q_ptr + rows * stride_q + cols, q, mask=mask)
    tl.store(scale_ptr + srow * stride_sr + scol * stride_sc, scale, mask=smask)


@triton.jit
def block_dequant_kernel(q_ptr, scale_ptr, out_ptr, R, C, stride_q, stride_sr, stride_sc, stride_out,
                         BR: tl.constexpr, BC: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr,
                         BR_PAD: tl.constexpr, BC_PAD: tl.constexpr, QFMT: tl.constexpr,
                         OUT: tl.constexpr, HW_FP8: tl.constexpr, EVEN: tl.constexpr):
    """out = fp32(q) * scale[block] (one fp32 multiply) stored as OUT ("fp32", "fp16", "bf16")."""
    rows, cols, mask, srow, scol, smask = block_tile(R, C, BR, BC, RB, CB, BR_PAD, BC_PAD, EVEN)
    codes = tl.load(q_ptr + rows * stride_q + cols, mask=mask, other=0)
    scale = tl.load(scale_ptr + srow * stride_sr + scol * stride_sc, mask=smask, other=1.0)
    x = decode_f32(codes, QFMT, HW_FP8) * scale[:, None, :, None]
    store_f32_as(out_ptr + rows * stride_out + cols, x, mask, OUT)


@triton.jit
def fp8_decode_kernel(src_ptr, out_ptr, R, C, stride_src, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """e4m3 codes src [R, C] (uint8 bits, row stride stride_src) -> their fp16 values, exactly, into
    out [R, C] contiguous: the W8A16 GEMM's operands decoded once per call (launch.py). torch's own
    cast ran at a third of the copy bandwidth on the H100."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    codes = tl.load(src_ptr + rows[:, None] * stride_src + cols[None, :], mask=mask, other=0)
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], fp8e4m3_decode_f16(codes), mask=mask)
