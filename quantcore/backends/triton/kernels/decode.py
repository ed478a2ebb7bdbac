"""The decode-sized block-scaled GEMM (M ≤ 64): the weight streamed by the whole GPU.

At decode a GEMM reads each weight byte once and does little else, so its time is the weight's
bytes over memory bandwidth, and the schedule's one job is to keep enough bytes in flight on every
SM. The kernel therefore swaps the operands — `out^T = b @ a^T`, so the weight's N rows fill the
MMA's wide side and M (1…64 rows, padded to 16) its narrow one — and splits K over a second grid
axis: program (n tile, k split) streams BLOCK_N × (its K blocks) of the weight. Per K block the
contract is unchanged: the dot accumulated in fp32 (FP8) or exactly in int32 (INT8), scaled by
a_s[m, kb] · b_s[n // SCALE_BN, kb] into an fp32 accumulator.

With SPLIT_K > 1 the splits meet in the same launch (`gemm.splits_summed`): each writes its fp32
partial tile to a workspace and counts itself in on the tile's counter; the last to arrive sums the
partials in split order 0, 1, … (a fixed order, so results are bit-for-bit the same run to run, and
those of the tiled GEMM split alike), resets the counter for the next launch and runs the epilogue.
A sets where the activation comes from: quantized codes with their scales ("fp8"/"int8"), or a float
tensor ("bf16"/"fp16"/"fp32") quantized per 1×BLOCK_K group in the prologue with act_quant's own
formulas — so that a fused quantized linear is bit for bit act_quant followed by this GEMM: by each
program for the rows it reads (a few rows), or ONCE for all of them into a workspace
(`quantize_once.py`), whose codes the loop then reads as quantized ones.
"""

import triton
import triton.language as tl

from .cast import to_f32
from .fp8 import nan_absmax
from .gemm import block_dot, finish_tile, splits_summed, tile_pointers
from .quant import block_scale, quantize
from .quantize_once import quantize_once, release_once


@triton.jit
def decode_mm_kernel(
        a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, bias_ptr, out_ptr, out_scale_ptr, ws_ptr, counter_ptr,
        q_ptr, qs_ptr, flag_ptr, M, N, K, kb_per_split, stride_am, stride_asm, stride_ask, stride_bn, stride_bsn,
        stride_bsk, stride_bias, stride_om, stride_osm, eps, a_eps,
        A: tl.constexpr, QFMT: tl.constexpr, USE_FP8_MMA: tl.constexpr, UE8M0_A: tl.constexpr,
        SCALE_BN: tl.constexpr, BIAS: tl.constexpr, ACTIVATION: tl.constexpr, OUT: tl.constexpr,
        OUT_GROUP: tl.constexpr, UE8M0_OUT: tl.constexpr, TINY_SCALES: tl.constexpr, HW_FP8: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
        STAGES: tl.constexpr, QROWS: tl.constexpr, ONCE: tl.constexpr, KB_VEC: tl.constexpr):
    """out [M, N] = a [M, K] @ b [N, K]^T with block scales and the fused epilogue, for M ≤ BLOCK_M.

    A: "fp8"/"int8" reads codes a with a_scale [M, ceil(K/BLOCK_K)]; "bf16"/"fp16"/"fp32" reads a float
    activation and quantizes it to QFMT per 1×BLOCK_K group (eps a_eps, UE8M0_A) in registers. Program
    (pid_n, pid_k) covers columns pid_n·BLOCK_N… and K blocks pid_k·kb_per_split…; ws_ptr holds
    SPLIT_K × cdiv(N, BLOCK_N) fp32 tiles of BLOCK_N × BLOCK_M and counter_ptr one int32 per column
    tile, zero between launches (unused when SPLIT_K == 1). STAGES: weight tiles in flight. QROWS:
    the rows a float activation is quantized in (a power of two >= M, at most BLOCK_M). ONCE (float A):
    the programs quantize it once between them into codes q_ptr [M, cdiv(K, BLOCK_K)·BLOCK_K] and scales
    qs_ptr [cdiv(K, BLOCK_K), M rounded up to 32], with flag_ptr's cdiv(K, BLOCK_K) + 1 int32 zero between launches
    (`quantize_once.py`; KB_VEC: a power of two >= kb_per_split). The rest is block_scaled_mm_kernel's.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs, b_ptrs, a_s_ptrs, b_s_ptrs = tile_pointers(
        a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, offs_m, offs_n, offs_k, pid_n, M, N, stride_am, stride_bn,
        stride_asm, stride_bsn, SCALE_BN, BLOCK_N)
    UNIFORM_BS: tl.constexpr = SCALE_BN % BLOCK_N == 0
    # The prologue quantizes only QROWS rows (wrapped into range like tile_pointers' rows) and repeats
    # them to the MMA's BLOCK_M: at M = 1 that is 1/16 of the divisions and encodes, which otherwise
    # cost more than the weight tile's memory time in every iteration.
    # Its load is too small for the pipeliner's asynchronous copies, so it is prefetched by hand, one
    # K block ahead, to keep its latency out of the loop.
    x_ptrs = a_ptr + (tl.arange(0, QROWS) % M)[:, None] * stride_am + offs_k[None, :]

    kb_start = pid_k * kb_per_split
    kb_end = tl.minimum(kb_start + kb_per_split, tl.cdiv(K, BLOCK_K))
    CODES: tl.constexpr = A == "fp8" or A == "int8" or ONCE
    if ONCE:
        quantize_once(a_ptr, stride_am, q_ptr, qs_ptr, flag_ptr, kb_start, kb_end, pid_n, tl.num_programs(0), M, K,
                      a_eps, A, QFMT, UE8M0_A, HW_FP8, QROWS, BLOCK_K, KB_VEC)
        num_kb = tl.cdiv(K, BLOCK_K)
        a_ptrs, _, a_s_ptrs, _ = tile_pointers(q_ptr, b_ptr, qs_ptr, b_scale_ptr, offs_m, offs_n, offs_k, pid_n, M, N,
                                               num_kb * BLOCK_K, stride_bn, 1, stride_bsn, SCALE_BN, BLOCK_N)
        stride_ask = tl.cdiv(M, 32) * 32
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if not CODES:
        x_next = tl.load(x_ptrs + kb_start * BLOCK_K, mask=offs_k[None, :] < K - kb_start * BLOCK_K, other=0)
    # The pipelining depth is asked of the loop itself: with bounds that depend on the program (its K
    # split), the launch's num_stages alone left the weight loads synchronous (checked in the TTGIR).
    for kb in tl.range(kb_start, kb_end, num_stages=STAGES):
        k_mask = offs_k[None, :] < K - kb * BLOCK_K
        b = tl.load(b_ptrs + kb * BLOCK_K, mask=k_mask, other=0)
        if CODES:
            # Codes quantized once were written in this launch by other SMs: read from L2 (.cg), never
            # a stale L1 line.
            a = tl.load(a_ptrs + kb * BLOCK_K, mask=k_mask, other=0, cache_modifier=".cg" if ONCE else "")
            a_s = tl.load(a_s_ptrs + kb * stride_ask, cache_modifier=".cg" if ONCE else "")
        else:
            x = to_f32(x_next, A)  # converted here, where it is used, so the load is waited for here
            x_next = tl.load(x_ptrs + (kb + 1) * BLOCK_K, mask=offs_k[None, :] < K - (kb + 1) * BLOCK_K, other=0)
            x_s = block_scale(nan_absmax(x, 1), a_eps, QFMT, UE8M0_A)
            x_q = quantize(x, x_s[:, None], QFMT, HW_FP8, UE8M0_A)
            a = tl.reshape(tl.broadcast_to(x_q[None, :, :], (BLOCK_M // QROWS, QROWS, BLOCK_K)), (BLOCK_M, BLOCK_K))
            a_s = tl.reshape(tl.broadcast_to(x_s[None, :], (BLOCK_M // QROWS, QROWS)), (BLOCK_M,))
        part = block_dot(b, a, None, QFMT, USE_FP8_MMA, False).to(tl.float32)  # [BLOCK_N, BLOCK_M]
        # The products in block_scaled_mm_kernel's order: part · (a_s · b_s) for one scale row of b,
        # else (part · a_s) · b_s.
        if UNIFORM_BS:
            acc += part * (a_s * tl.load(b_s_ptrs + kb * stride_bsk))[None, :]
        else:
            acc += part * a_s[None, :] * tl.load(b_s_ptrs + kb * stride_bsk)[:, None]
    if ONCE:
        release_once(flag_ptr, tl.cdiv(K, BLOCK_K), tl.num_programs(0) * tl.num_programs(1), KB_VEC)

    if SPLIT_K == 1:
        finish_tile(tl.trans(acc), offs_m, offs_n, pid_n, M, N, bias_ptr, stride_bias, out_ptr, stride_om,
                    out_scale_ptr, stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, TINY_SCALES, HW_FP8,
                    BLOCK_M, BLOCK_N)
    else:
        last, total = splits_summed(acc, ws_ptr, counter_ptr, pid_n, tl.cdiv(N, BLOCK_N), pid_k, SPLIT_K)
        if last:
            finish_tile(tl.trans(total), offs_m, offs_n, pid_n, M, N, bias_ptr, stride_bias, out_ptr, stride_om,
                        out_scale_ptr, stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, TINY_SCALES,
                        HW_FP8, BLOCK_M, BLOCK_N)
