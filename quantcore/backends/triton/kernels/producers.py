"""The fused producers: RMSNorm (with the residual add) and SiLU-and-multiply, each quantized per 1×G block
in the same pass (docs/numerics.md, "Fused producers").

Both lay their program's values out as the block quantizer does (`quant.block_tile`: [RB, 1, CB, BC_PAD],
whole groups padded to a power of two and masked) and end with its `store_quantized`, so that their codes
and scales are act_quant's of the same fp32 values. The norm's program holds one row: its sum of squares
is the contract's tree (`pairwise_sum`), spelled out as adds of neighbours, because `tl.sum` leaves its
order to the compiler and the interpreter.
"""

import triton
import triton.language as tl

from .cast import load_f32, round_to, store_f32_as
from .epilogue import activate
from .quant import block_tile, store_quantized


@triton.jit
def pairwise_sum(t, LEVELS: tl.constexpr):
    """Σ of a 1-D fp32 tensor of 2^LEVELS non-negative values -> [1]: neighbours added first, level by level
    (t[2i] + t[2i+1]); a sum over an axis of two is one add, the same on the GPU and in the interpreter."""
    for _ in tl.static_range(LEVELS):
        t = tl.sum(tl.reshape(t, (t.shape[0] // 2, 2)), axis=1)
    return t


@triton.jit
def _norm_input(x_ptr, res_ptr, x_offs, res_offs, mask, SRC: tl.constexpr, RESIDUAL: tl.constexpr):
    """The values the norm reads, in fp32: x, or x + residual rounded to x's kind (0 where masked)."""
    v = load_f32(x_ptr + x_offs, mask, SRC)
    if RESIDUAL:
        v = round_to(v + load_f32(res_ptr + res_offs, mask, SRC), SRC)
    return v


@triton.jit
def rms_norm_quant_kernel(x_ptr, w_ptr, res_ptr, q_ptr, scale_ptr, new_res_ptr, M, H, stride_x, stride_res,
                          stride_new_res, stride_q, stride_sr, stride_sc, eps, quant_eps,
                          GROUP: tl.constexpr, NG_PAD: tl.constexpr, G_PAD: tl.constexpr, FLAT: tl.constexpr,
                          LEVELS: tl.constexpr, TILE_SUM: tl.constexpr, SRC: tl.constexpr, WKIND: tl.constexpr,
                          OUT: tl.constexpr, RESIDUAL: tl.constexpr, QFMT: tl.constexpr, UE8M0: tl.constexpr,
                          HW_FP8: tl.constexpr, EVEN: tl.constexpr, TINY_SCALES: tl.constexpr):
    """One row of x [M, H] (SRC kind; + residual when RESIDUAL, stored to new_res) per program: RMSNorm with
    weight [H] (WKIND), the product rounded to OUT, quantized per 1×GROUP into q (QFMT) and scale.

    The row is held as NG_PAD groups of G_PAD. TILE_SUM: that tile, flattened, is the row padded with zeros
    (groups a power of two, or one group), so its squares are summed from it; else the row is loaded again
    as one vector of FLAT, the next power of two. Either way 2^LEVELS values, summed by `pairwise_sum`."""
    rows, cols, mask, srow, scol, smask = block_tile(M, H, 1, GROUP, 1, NG_PAD, 1, G_PAD, EVEN)
    v = _norm_input(x_ptr, res_ptr, rows * stride_x + cols, rows * stride_res + cols, mask, SRC, RESIDUAL)
    if RESIDUAL:
        store_f32_as(new_res_ptr + rows * stride_new_res + cols, v, mask, SRC)
    if TILE_SUM:
        total = pairwise_sum(tl.reshape(v * v, (NG_PAD * G_PAD,)), LEVELS)
    else:
        row = tl.program_id(0)
        offs = tl.arange(0, FLAT)
        flat = _norm_input(x_ptr, res_ptr, row * stride_x + offs, row * stride_res + offs, offs < H, SRC, RESIDUAL)
        total = pairwise_sum(flat * flat, LEVELS)
    # IEEE division and square root, on [1] tensors (tl.div_rn takes no scalars); 0 + H is H exactly (H, not
    # H.to(): the JIT passes H = 1 as a Python int).
    zero = tl.zeros_like(total)
    mean_square = tl.div_rn(total, zero + H)
    rstd = tl.reshape(tl.div_rn(zero + 1.0, tl.sqrt_rn(mean_square + eps)), (1, 1, 1, 1))
    normed = round_to(v * rstd, SRC)
    # Masked lanes are 0 here without a select: their x and weight loaded as 0 and rstd is finite, or NaN for a
    # row holding a NaN, whose every group's scale is NaN anyway.
    y = round_to(load_f32(w_ptr + cols, mask, WKIND) * normed, OUT)
    store_quantized(y, rows, cols, mask, srow, scol, smask, q_ptr, stride_q, scale_ptr, stride_sr, stride_sc,
                    quant_eps, QFMT, UE8M0, HW_FP8, TINY_SCALES)


@triton.jit
def silu_mul_quant_kernel(src_ptr, counts_ptr, q_ptr, scale_ptr, R, C, rows_per_expert, stride_src, stride_q,
                          stride_sr, stride_sc, eps,
                          BC: tl.constexpr, RB: tl.constexpr, CB: tl.constexpr, BC_PAD: tl.constexpr,
                          SRC: tl.constexpr, QFMT: tl.constexpr, UE8M0: tl.constexpr, HW_FP8: tl.constexpr,
                          EVEN: tl.constexpr, MASKED: tl.constexpr, TINY_SCALES: tl.constexpr):
    """silu(gate)·up in fp32 of src [R, 2C] (gate = src[:, :C], up = src[:, C:]), quantized per 1×BC into
    q [R, C] (QFMT) and scale. MASKED: the rows are experts' [rows_per_expert] rows in turn, and a row
    r % rows_per_expert at or past counts[r // rows_per_expert] (int32) is neither read nor written."""
    rows, cols, mask, srow, scol, smask = block_tile(R, C, 1, BC, RB, CB, 1, BC_PAD, EVEN)
    if MASKED:
        count = tl.load(counts_ptr + srow // rows_per_expert, mask=srow < R, other=0)
        counted = srow % rows_per_expert < count
        mask = mask & counted[:, :, None, None]
        smask = smask & counted
    gate = load_f32(src_ptr + rows * stride_src + cols, mask, SRC)
    up = load_f32(src_ptr + rows * stride_src + (cols + C), mask, SRC)
    # Masked lanes are 0 already (silu(0)·0), also past an expert's count.
    store_quantized(activate(gate, "silu") * up, rows, cols, mask, srow, scol, smask, q_ptr, stride_q, scale_ptr,
                    stride_sr, stride_sc, eps, QFMT, UE8M0, HW_FP8, TINY_SCALES)
