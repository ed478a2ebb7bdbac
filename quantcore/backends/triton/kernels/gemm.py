"""The block-scaled GEMM: one template, specialised by compile-time switches.

out[m, n] = Σ_kb dot_kb(a, b)[m, n] · a_s[m, kb] · b_s[n // SCALE_BN, kb], then bias, activation and
either a cast or a 1×OUT_GROUP re-quantization, all in one kernel. BLOCK_K equals the scale block
along K, so each tl.dot is exactly one scale block: FP8 with an fp32 result, INT8 exact in int32.

Where the output tiles alone leave SMs idle, K is split over a second grid axis and the splits meet
in the same launch (`splits_summed`, shared with the decode kernel): the partial sums of split s are
those of its K blocks in order, and the last split to arrive adds the partials in split order 0, 1, …
"""

import triton
import triton.language as tl

from .cast import load_f32, store_f32_as
from .epilogue import activate
from .fp8 import fp8e4m3_decode_f16
from .quant import group_quantize


@triton.jit
def _load_k_block(a_ptrs, b_ptrs, a_desc, b_desc, off_m, off_n, offs_k, kb, K,
                  TMA: tl.constexpr, BLOCK_K: tl.constexpr):
    """K step `kb` (BLOCK_K wide) of this program's A rows and B rows (zeros past K): through the
    tensor-memory accelerator when TMA (its out-of-bounds fill does the masking), else masked pointer
    loads."""
    if TMA:
        a = a_desc.load([off_m, kb * BLOCK_K])
        b = b_desc.load([off_n, kb * BLOCK_K])
    else:
        k_mask = offs_k[None, :] < K - kb * BLOCK_K
        a = tl.load(a_ptrs + kb * BLOCK_K, mask=k_mask, other=0)
        b = tl.load(b_ptrs + kb * BLOCK_K, mask=k_mask, other=0)
    return a, b


@triton.jit
def block_dot(a, b, acc, QFMT: tl.constexpr, USE_FP8_MMA: tl.constexpr, TMA: tl.constexpr):
    """One K block's a @ b^T: int32 for INT8 (exact), fp32 for FP8; added in the MMA to `acc`, the
    same block's dot over the K before it, when not None (a block multiplied in steps)."""
    if QFMT == "int8":
        return tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32)
    elif USE_FP8_MMA:
        # Hopper's FP8 MMA adds products with a reduced-precision accumulator: on an H100 this
        # path is ~1.3e-4 relative (Frobenius) from float64, the others ~1e-7. Promoting into
        # fp32 every 32 products (max_num_imprecise_acc=32) only reached 4.5e-5, at 26% less
        # throughput, so Triton's default is kept. TMA delivers e4m3 typed tiles; pointers, bits.
        if not TMA:
            a = a.to(tl.float8e4nv, bitcast=True)
            b = b.to(tl.float8e4nv, bitcast=True)
        return tl.dot(a, tl.trans(b), acc)
    else:
        # FP8 codes are decoded here, tile by tile; operands the launch decoded once per call arrive as fp16.
        if a.dtype != tl.float16:
            a = fp8e4m3_decode_f16(a)
        if b.dtype != tl.float16:
            b = fp8e4m3_decode_f16(b)
        return tl.dot(a, tl.trans(b), acc)


@triton.jit
def _scaled(part, a_s_ptrs, b_s_ptrs, kb, stride_ask, stride_bsk, valid, UNIFORM_BS: tl.constexpr):
    """fp32(part) * a_s[m, kb] * b_s[n-block, kb]. A K block past the end (valid false: zero tiles,
    kb clamped in range) gets zero scales, so it adds exactly 0 whatever the last real scales hold."""
    a_s = tl.where(valid, tl.load(a_s_ptrs + kb * stride_ask), 0.0)
    b_s = tl.where(valid, tl.load(b_s_ptrs + kb * stride_bsk), 0.0)
    if UNIFORM_BS:
        return part.to(tl.float32) * (a_s * b_s)[:, None]
    else:
        return part.to(tl.float32) * a_s[:, None] * b_s[None, :]


@triton.jit
def tile_pointers(a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, offs_m, offs_n, offs_k, pid_n, M, N, stride_am,
                  stride_bn, stride_asm, stride_bsn, SCALE_BN: tl.constexpr, BLOCK_N: tl.constexpr):
    """Pointers to K block 0 of a program's A rows offs_m and B rows offs_n (columns offs_k), to their
    rows of a_scale, and to b_scale: one scalar when the tile lies inside one scale row of b
    (SCALE_BN % BLOCK_N == 0: the scale then folds into the per-row a scale, one FMA per accumulator
    element), else one per row."""
    # Wrapping the tail rows back into range keeps the loads unmasked along M and N; those rows are
    # never stored.
    rows_a = offs_m % M
    rows_b = offs_n % N
    a_ptrs = a_ptr + rows_a[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + rows_b[:, None] * stride_bn + offs_k[None, :]
    if SCALE_BN % BLOCK_N == 0:
        b_s_ptrs = b_scale_ptr + (pid_n * BLOCK_N // SCALE_BN) * stride_bsn
    else:
        b_s_ptrs = b_scale_ptr + (rows_b // SCALE_BN) * stride_bsn
    return a_ptrs, b_ptrs, a_scale_ptr + rows_a * stride_asm, b_s_ptrs


@triton.jit
def scaled_k_blocks(a_ptrs, b_ptrs, a_desc, b_desc, a_s_ptrs, b_s_ptrs, off_m, off_n, offs_k, kb_start, kb_end, K,
                    stride_ask, stride_bsk, QFMT: tl.constexpr, USE_FP8_MMA: tl.constexpr, TMA: tl.constexpr,
                    UNIFORM_BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    K_STEP: tl.constexpr, BLOCK_KS: tl.constexpr):
    """The fp32 [BLOCK_M, BLOCK_N] tile Σ fp32(dot_kb) · a_s · b_s over K blocks kb_start ≤ kb < kb_end, added in
    order to zeros: the main loop of `block_scaled_mm_kernel` (whose docstring says what K_STEP, BLOCK_KS and TMA
    do), shared with the grouped GEMM so that an expert's rows get the dense GEMM's sums. The pointers are
    `tile_pointers`' (a_ptrs/b_ptrs with BLOCK_KS columns offs_k); off_m/off_n are the tile's TMA coordinates."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BLOCK_KS < BLOCK_K:
        tl.static_assert(K_STEP == 1 and not TMA and BLOCK_K % BLOCK_KS == 0)
        STEPS: tl.constexpr = BLOCK_K // BLOCK_KS
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if QFMT == "int8" else tl.float32)
        for i in range(kb_start * STEPS, kb_end * STEPS):
            a, b = _load_k_block(a_ptrs, b_ptrs, a_desc, b_desc, 0, 0, offs_k, i, K, False, BLOCK_KS)
            part = block_dot(a, b, part, QFMT, USE_FP8_MMA, False)
            if i % STEPS == STEPS - 1:
                acc += _scaled(part, a_s_ptrs, b_s_ptrs, i // STEPS, stride_ask, stride_bsk, True, UNIFORM_BS)
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=part.dtype)
    else:
        for kb in range(kb_start, kb_end, K_STEP):
            a0, b0 = _load_k_block(a_ptrs, b_ptrs, a_desc, b_desc, off_m, off_n, offs_k, kb, K, TMA, BLOCK_K)
            if K_STEP == 2:
                a1, b1 = _load_k_block(a_ptrs, b_ptrs, a_desc, b_desc, off_m, off_n, offs_k, kb + 1, K, TMA, BLOCK_K)
            part0 = block_dot(a0, b0, None, QFMT, USE_FP8_MMA, TMA)
            if K_STEP == 2:
                part1 = block_dot(a1, b1, None, QFMT, USE_FP8_MMA, TMA)
            acc += _scaled(part0, a_s_ptrs, b_s_ptrs, kb, stride_ask, stride_bsk, True, UNIFORM_BS)
            if K_STEP == 2:
                acc += _scaled(part1, a_s_ptrs, b_s_ptrs, tl.minimum(kb + 1, kb_end - 1), stride_ask, stride_bsk,
                               kb + 1 < kb_end, UNIFORM_BS)
    return acc


@triton.jit
def finish_tile(acc, offs_m, offs_n, pid_n, M, N, bias_ptr, stride_bias, out_ptr, stride_om, out_scale_ptr,
                stride_osm, eps, BIAS: tl.constexpr, ACTIVATION: tl.constexpr, OUT: tl.constexpr,
                OUT_GROUP: tl.constexpr, UE8M0_OUT: tl.constexpr, TINY_SCALES: tl.constexpr, HW_FP8: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The epilogue of a [BLOCK_M, BLOCK_N] fp32 tile at rows offs_m, columns offs_n (column tile pid_n):
    + bias, activation, then a cast to OUT or a 1×OUT_GROUP re-quantization; OUT_GROUP divides BLOCK_N.
    TINY_SCALES: a re-quantization scale may lie below `quant.TINY_SCALE` (`quant.divide`)."""
    n_mask = offs_n < N
    mask = (offs_m < M)[:, None] & n_mask[None, :]
    if BIAS != "none":
        acc = acc + load_f32(bias_ptr + offs_n * stride_bias, n_mask, BIAS)[None, :]
    acc = activate(acc, ACTIVATION)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    if OUT == "fp8" or OUT == "int8":
        GROUPS: tl.constexpr = BLOCK_N // OUT_GROUP
        # Columns past N must not reach a group's amax.
        q, scale = group_quantize(tl.where(mask, acc, 0.0), eps, OUT_GROUP, OUT, UE8M0_OUT, HW_FP8, TINY_SCALES)
        tl.store(out_ptrs, q, mask=mask)
        groups = pid_n * GROUPS + tl.arange(0, GROUPS)
        tl.store(out_scale_ptr + offs_m[:, None] * stride_osm + groups[None, :], scale,
                 mask=(offs_m < M)[:, None] & (groups < tl.cdiv(N, OUT_GROUP))[None, :])
    else:
        store_f32_as(out_ptrs, acc, mask, OUT)


@triton.jit
def splits_summed(acc, ws_ptr, counter_ptr, tile, num_tiles, pid_k, split_k):
    """Split pid_k's partial tile `acc` [R, C] fp32 of output tile `tile` (of num_tiles) into the
    workspace, counted in on the tile's counter: (True, the split_k partials summed in split order
    0, 1, … from zero) for the last split to arrive, which sets the counter back to 0 for the next
    launch; (False, zeros) for the others. ws_ptr holds split_k × num_tiles tiles of R × C fp32,
    counter_ptr one int32 per tile, zero between launches. The fixed order makes a split launch
    bit-for-bit the same run to run, and the same as any kernel that splits K alike."""
    R: tl.constexpr = acc.shape[0]
    C: tl.constexpr = acc.shape[1]
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(ws_ptr + (pid_k * num_tiles + tile) * (R * C) + offs, acc)
    # Every thread's partial is written before the tile counts this split in (release), and the last
    # split reads the others' partials only after seeing all of them counted (acquire).
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    total = tl.zeros((R, C), dtype=tl.float32)
    last = arrived == split_k - 1
    if last:
        for s in range(split_k):
            # .cg: read from L2, where the other SMs' partials are, never a stale L1 line.
            total += tl.load(ws_ptr + (s * num_tiles + tile) * (R * C) + offs, cache_modifier=".cg")
        tl.store(counter_ptr + tile, 0)
    return last, total


@triton.jit
def block_scaled_mm_kernel(
        a_ptr, b_ptr, a_desc, b_desc, a_scale_ptr, b_scale_ptr, bias_ptr, out_ptr, out_scale_ptr, ws_ptr,
        counter_ptr, M, N, K, kb_per_split, stride_am, stride_bn, stride_asm, stride_ask, stride_bsn, stride_bsk,
        stride_bias, stride_om, stride_osm, eps,
        QFMT: tl.constexpr, USE_FP8_MMA: tl.constexpr, TMA: tl.constexpr, SCALE_BN: tl.constexpr,
        BIAS: tl.constexpr, ACTIVATION: tl.constexpr, OUT: tl.constexpr, OUT_GROUP: tl.constexpr,
        UE8M0_OUT: tl.constexpr, TINY_SCALES: tl.constexpr, HW_FP8: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_STEP: tl.constexpr, BLOCK_KS: tl.constexpr,
        GROUP_M: tl.constexpr, SPLIT: tl.constexpr):
    """a [M, K] @ b [N, K]^T with block scales, fused epilogue.

    QFMT "fp8" or "int8". USE_FP8_MMA multiplies FP8 on FP8 tensor cores (sm_89+); without it FP8
    (uint8 bits) is decoded to fp16 (exact) for fp16 MMA with fp32 accumulation, which every sm_80+
    GPU has. TMA loads tiles through the host tensor descriptors a_desc [M, K] / b_desc [N, K]
    (sm_90+, typed e4m3/int8) instead of a_ptr / b_ptr (uint8 bits or int8). K_STEP K blocks (1 or
    2) are multiplied per iteration before their fp32 promotion: two dots in flight before the
    promotion waits keep Hopper's tensor cores busier. BLOCK_KS < BLOCK_K (pointer loads, K_STEP 1)
    steps through each K block BLOCK_KS at a time instead, chaining the steps' MMAs on one
    accumulator (the products summed in the order of one BLOCK_K dot) and promoting it at the
    block's end: a pipeline stage then holds BLOCK_KS of K, so 16-bit operands get more stages in the
    same shared memory. BIAS is the bias kind or "none"; OUT is
    "fp32"/"fp16"/"bf16" for a cast, or "fp8"/"int8" to re-quantize per 1×OUT_GROUP (OUT_GROUP must
    divide BLOCK_N) into out and out_scale [M, ceil(N/OUT_GROUP)], encoding FP8 with the conversion
    instructions when HW_FP8 (sm_89+); TINY_SCALES as `finish_tile`'s. SPLIT: program (tile, pid_k) of a
    (tiles, splits) grid multiplies K blocks pid_k·kb_per_split… (at most kb_per_split of them) and
    `splits_summed` meets the splits in ws_ptr / counter_ptr (splits × tiles fp32 tiles of BLOCK_M × BLOCK_N,
    one int32 per tile); otherwise kb_per_split is unused and K is walked whole. (The split count is the grid's, not a
    compile-time constant: one compiled kernel serves every split of a tile.)
    """
    # Grouped ordering: GROUP_M row-tiles share each column strip of b while it is in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_KS)
    a_ptrs, b_ptrs, a_s_ptrs, b_s_ptrs = tile_pointers(
        a_ptr, b_ptr, a_scale_ptr, b_scale_ptr, offs_m, offs_n, offs_k, pid_n, M, N, stride_am, stride_bn,
        stride_asm, stride_bsn, SCALE_BN, BLOCK_N)

    kb_start, kb_end = 0, tl.cdiv(K, BLOCK_K)
    if SPLIT:
        kb_start = tl.program_id(1) * kb_per_split
        kb_end = tl.minimum(kb_start + kb_per_split, kb_end)
    acc = scaled_k_blocks(a_ptrs, b_ptrs, a_desc, b_desc, a_s_ptrs, b_s_ptrs, pid_m * BLOCK_M, pid_n * BLOCK_N, offs_k,
                          kb_start, kb_end, K, stride_ask, stride_bsk, QFMT, USE_FP8_MMA, TMA, SCALE_BN % BLOCK_N == 0,
                          BLOCK_M, BLOCK_N, BLOCK_K, K_STEP, BLOCK_KS)

    if not SPLIT:
        finish_tile(acc, offs_m, offs_n, pid_n, M, N, bias_ptr, stride_bias, out_ptr, stride_om, out_scale_ptr,
                    stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, TINY_SCALES, HW_FP8, BLOCK_M,
                    BLOCK_N)
    else:
        last, total = splits_summed(acc, ws_ptr, counter_ptr, pid, num_m * num_n, tl.program_id(1),
                                    tl.num_programs(1))
        if last:
            finish_tile(total, offs_m, offs_n, pid_n, M, N, bias_ptr, stride_bias, out_ptr, stride_om, out_scale_ptr,
                        stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, TINY_SCALES, HW_FP8, BLOCK_M,
                        BLOCK_N)

