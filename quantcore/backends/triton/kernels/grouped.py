"""The grouped block-scaled GEMM of mixture-of-experts layers: the dense GEMM's tile program
(`gemm.tile_pointers`, `gemm.scaled_k_blocks`, `gemm.finish_tile`) run on one expert's rows and weight.

Each program finds its expert, the expert's rows and its row tile among them, then moves every base
pointer to that expert and runs the dense tile with M = the expert's row count: an expert's rows get
the sums of `block_scaled_mm_kernel` unsplit, bit for bit (K blocks in order, the same scaling and
epilogue), whatever the other experts hold. K is never split.

Both layouts read their row counts on the device, so a launch needs no host synchronization and can be
captured in a CUDA graph with its grid fixed by shapes alone:
- contiguous (MASKED false): rows sorted by expert, expert e's rows offsets[e]:offsets[e+1]. The grid has
  a program per output tile of an upper bound ((ceil(M/BLOCK_M) + E) row tiles, each expert adding at most
  one partial tile, times the column tiles); program p takes the p-th tile in `_contiguous_tile`'s order,
  and programs past the last tile exit.
- masked (MASKED true): a [E, max_m, K]; program (m tile, n tile, e) exits past min(masked_m[e], max_m).
"""

import triton
import triton.language as tl

from .gemm import finish_tile, scaled_k_blocks, tile_pointers


@triton.jit
def _contiguous_tile(offsets_ptr, pid, E, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, E_PAD: tl.constexpr,
                     GROUP_M: tl.constexpr):
    """(expert, its first row, its row count, row tile, column tile) of program `pid`, the output tiles
    numbered expert by expert and, inside an expert, GROUP_M row tiles at a time column tile by column tile
    (the dense GEMM's L2 order): the programs running together share one expert's weight tiles and a few of
    its row tiles, so each is read from memory about once. Numbered column-major over the whole grid
    instead, the SMs read as many experts' weights as they run programs, none shared (H100, FP8, 128-512 rows
    an expert: 310-437 TFLOP/s that way, bound by memory; 518-687 in this order with TMA loads). A count of 0
    past the last tile. Every program scans the E + 1 offsets itself (E_PAD >= E lanes): a few hundred bytes
    from L2, and no schedule kernel or workspace to keep in step with them."""
    experts = tl.arange(0, E_PAD)
    lo = tl.load(offsets_ptr + experts, mask=experts < E, other=0)
    hi = tl.load(offsets_ptr + experts + 1, mask=experts < E, other=0)
    m_tiles = tl.cdiv(hi - lo, BLOCK_M)
    tiles = m_tiles * tl.cdiv(N, BLOCK_N)
    ends = tl.cumsum(tiles, 0)
    e = tl.sum((ends <= pid).to(tl.int32), 0)  # E past the last tile, whose count then reads as 0
    mine = experts == e
    first = tl.sum(tl.where(mine, lo, 0), 0)
    count = tl.sum(tl.where(mine, hi - lo, 0), 0)
    local = pid - tl.sum(tl.where(mine, ends - tiles, 0), 0)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (local // per_group) * GROUP_M
    size_m = tl.maximum(tl.minimum(tl.sum(tl.where(mine, m_tiles, 0), 0) - first_m, GROUP_M), 1)
    return e, first, count, first_m + (local % per_group) % size_m, (local % per_group) // size_m


@triton.jit
def grouped_mm_kernel(
        a_ptr, b_ptr, a_desc, b_desc, a_scale_ptr, b_scale_ptr, bias_ptr, out_ptr, out_scale_ptr, rows_ptr,
        E, M, N, K, stride_ae, stride_am, stride_be, stride_bn, stride_ase, stride_asm, stride_ask, stride_bse,
        stride_bsn, stride_bsk, stride_biase, stride_bias, stride_oe, stride_om, stride_ose, stride_osm, eps,
        MASKED: tl.constexpr, QFMT: tl.constexpr, USE_FP8_MMA: tl.constexpr, TMA: tl.constexpr, SCALE_BN: tl.constexpr,
        BIAS: tl.constexpr, ACTIVATION: tl.constexpr, OUT: tl.constexpr, OUT_GROUP: tl.constexpr,
        UE8M0_OUT: tl.constexpr, TINY_SCALES: tl.constexpr, HW_FP8: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEP: tl.constexpr, BLOCK_KS: tl.constexpr,
        E_PAD: tl.constexpr, GROUP_M: tl.constexpr):
    """Per expert e: out_e = a_e @ b[e]^T with block scales and the fused epilogue (bias[e]).

    rows_ptr: int32 offsets [E + 1] (contiguous; a [M, K], out [M, N], M the total rows) or masked_m [E]
    (MASKED; a [E, M, K], out [E, M, N], M = max_m). stride_*e are the expert strides (0 for a contiguous
    layout's activation, scales and output, which the expert's first row places instead). The constexprs
    are `block_scaled_mm_kernel`'s (K unsplit). TMA: the tiles of a and b come through the descriptors a_desc
    over a's rows as one [rows, K] matrix and b_desc over b as [E·N, K]; a tile reaching past its expert's
    rows or columns reads the next expert's (or zeros past the end), which only rows and columns the
    epilogue never stores see. E_PAD: a power of two >= E; GROUP_M: row tiles an L2 group (contiguous).
    Masked: program (m tile, n tile, e), an expert's column tiles adjacent.
    """
    if MASKED:
        e = tl.program_id(2)
        first = 0
        count = tl.minimum(tl.load(rows_ptr + e), M)
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:
        e, first, count, pid_m, pid_n = _contiguous_tile(rows_ptr, tl.program_id(0), E, N, BLOCK_M, BLOCK_N, E_PAD,
                                                         GROUP_M)
    if pid_m * BLOCK_M < count:
        # 64-bit: an expert's weight offset (e·N·K) passes 2^31 from a few experts on, its first row's from
        # 2^31 / K rows.
        ex = e.to(tl.int64)
        row = first
        if not MASKED:
            row = first.to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_KS)
        a_ptrs, b_ptrs, a_s_ptrs, b_s_ptrs = tile_pointers(
            a_ptr + ex * stride_ae + row * stride_am, b_ptr + ex * stride_be,
            a_scale_ptr + ex * stride_ase + row * stride_asm, b_scale_ptr + ex * stride_bse, offs_m, offs_n, offs_k,
            pid_n, count, N, stride_am, stride_bn, stride_asm, stride_bsn, SCALE_BN, BLOCK_N)
        off_m = (e * M if MASKED else first) + pid_m * BLOCK_M
        acc = scaled_k_blocks(a_ptrs, b_ptrs, a_desc, b_desc, a_s_ptrs, b_s_ptrs, off_m, e * N + pid_n * BLOCK_N,
                              offs_k, 0, tl.cdiv(K, BLOCK_K), K, stride_ask, stride_bsk, QFMT, USE_FP8_MMA, TMA,
                              SCALE_BN % BLOCK_N == 0, BLOCK_M, BLOCK_N, BLOCK_K, K_STEP, BLOCK_KS)
        finish_tile(acc, offs_m, offs_n, pid_n, count, N, bias_ptr + ex * stride_biase, stride_bias,
                    out_ptr + ex * stride_oe + row * stride_om, stride_om,
                    out_scale_ptr + ex * stride_ose + row * stride_osm, stride_osm, eps, BIAS, ACTIVATION, OUT,
                    OUT_GROUP, UE8M0_OUT, TINY_SCALES, HW_FP8, BLOCK_M, BLOCK_N)
