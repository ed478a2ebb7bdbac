"""A float activation quantized once per launch inside a GEMM, for every program that reads it.

A GEMM whose programs each quantize the activation rows they read repeats that work once per column
tile; from ~8 rows that costs more than a separate act_quant launch (measured on the H100). Here the programs that
share rows quantize each K block of them once, into a workspace, with act_quant's formulas (so the codes and scales
are act_quant's, bit for bit), and then read the codes as a GEMM on quantized operands does.

Per K block `kb` of the rows an int32 flag says: 0 unclaimed, 1 being quantized, 2 published. A
program first claims its own blocks (every num_shares-th from its share index) and quantizes them,
then waits until every block of its range is claimed — for a bounded number of polls, after which it
claims and quantizes those still unclaimed (their owner has not started) — and then until every
block is published. Past that bound it waits only on flags at 1, held by a program that is running
and never waits before publishing: no order of program dispatch can deadlock. After its main loop
each program counts itself in; the last of the launch sets the flags and the count back to 0 for the
next launch (stream order), as the split-K counters are (`runtime/workspace.py`).
"""

import triton
import triton.language as tl

from .cast import to_f32
from .fp8 import nan_absmax
from .quant import block_scale, quantize

STEP_ROWS = tl.constexpr(32)
PATIENCE = tl.constexpr(32)


@triton.jit
def _publish(x_ptr, stride_xm, q_ptr, qs_ptr, flags, kb, M, K, eps,
             A: tl.constexpr, QFMT: tl.constexpr, UE8M0: tl.constexpr, HW_FP8: tl.constexpr,
             ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Quantize the M rows (at most ROWS) of K block kb per 1×BLOCK_K group into codes q [M, K rounded
    up to BLOCK_K] and scales qs [cdiv(K, BLOCK_K), M rounded up to 32] (`workspace.once_buffers`), then
    publish the block (flag 2)."""
    num_kb = tl.cdiv(K, BLOCK_K)
    cols = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    # STEP_ROWS rows at a time: a whole [ROWS, BLOCK_K] fp32 tile in registers spilled beside the
    # GEMM's (ptxas for sm_90a).
    for r0 in range(0, tl.minimum(ROWS, M), STEP_ROWS):
        rows = r0 + tl.arange(0, STEP_ROWS)
        x = to_f32(tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :],
                           mask=(rows < M)[:, None] & (cols < K)[None, :], other=0), A)
        s = block_scale(nan_absmax(x, 1), eps, QFMT, UE8M0)
        q = quantize(x, s[:, None], QFMT, HW_FP8, UE8M0)
        tl.store(q_ptr + rows[:, None] * (num_kb * BLOCK_K) + cols[None, :], q, mask=(rows < M)[:, None])
        tl.store(qs_ptr + kb * (tl.cdiv(M, 32) * 32) + rows, s, mask=rows < M)
    # Every thread's codes are written before the flag says so (release).
    tl.debug_barrier()
    tl.atomic_xchg(flags + kb, 2, sem="release")


@triton.jit
def _poll(flags, kbs, inside, kb_start, SEM: tl.constexpr):
    """The flags of blocks kbs (lanes inside the range; the others read as published)."""
    state = tl.atomic_add(flags + tl.where(inside, kbs, kb_start), 0, mask=inside, sem=SEM)
    return tl.where(inside, state, 2)


@triton.jit
def quantize_once(x_ptr, stride_xm, q_ptr, qs_ptr, flags, kb_start, kb_end, share, num_shares, M, K, eps,
                  A: tl.constexpr, QFMT: tl.constexpr, UE8M0: tl.constexpr, HW_FP8: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK_K: tl.constexpr, KB_VEC: tl.constexpr):
    """Make K blocks kb_start…kb_end (at most KB_VEC) of x's M rows published in q / qs, sharing the
    work with the num_shares programs that need them (this one is `share`). `flags` holds one flag per
    K block."""
    for kb in range(kb_start + share, kb_end, num_shares):
        if tl.atomic_cas(flags + kb, 0, 1, sem="acq_rel") == 0:
            _publish(x_ptr, stride_xm, q_ptr, qs_ptr, flags, kb, M, K, eps, A, QFMT, UE8M0, HW_FP8, ROWS, BLOCK_K)
    kbs = kb_start + tl.arange(0, KB_VEC)
    inside = kbs < kb_end
    # Owners claim their blocks as they start. Claiming the others' at once made one early program
    # quantize most of its range alone while the rest waited; a block still
    # unclaimed after PATIENCE polls has an owner not yet running, and is taken over.
    # (The loops carry scalars only: Triton 3.6 fails to compile loops carrying these vectors.)
    polls = 0
    while (tl.sum((_poll(flags, kbs, inside, kb_start, "relaxed") == 0).to(tl.int32)) > 0) & (polls < PATIENCE):
        polls += 1
    state = _poll(flags, kbs, inside, kb_start, "relaxed")
    # Lanes whose block was claimed compare against -1, which no flag holds: they change nothing.
    old = tl.atomic_cas(flags + tl.where(inside, kbs, kb_start), tl.where(state == 0, 0, -1),
                        tl.full((KB_VEC,), 1, tl.int32), sem="acq_rel")
    won = (state == 0) & (old == 0)
    kb = tl.min(tl.where(won, kbs, kb_end))
    while kb < kb_end:
        _publish(x_ptr, stride_xm, q_ptr, qs_ptr, flags, kb, M, K, eps, A, QFMT, UE8M0, HW_FP8, ROWS, BLOCK_K)
        kb = tl.min(tl.where(won & (kbs > kb), kbs, kb_end))
    while tl.sum((_poll(flags, kbs, inside, kb_start, "relaxed") != 2).to(tl.int32)) > 0:
        pass
    # Every block is published: one acquiring read orders the codes' loads after the flags.
    _poll(flags, kbs, inside, kb_start, "acquire")


@triton.jit
def release_once(flags, count, programs, KB_VEC: tl.constexpr):
    """Count this program in after its last read of the codes; the launch's last program sets the
    `count` flags at `flags` and the counter after them back to 0."""
    tl.debug_barrier()
    if tl.atomic_add(flags + count, 1, sem="acq_rel") == programs - 1:
        for k0 in range(0, count, KB_VEC):
            offs = k0 + tl.arange(0, KB_VEC)
            tl.store(flags + offs, 0, mask=offs < count)
        tl.store(flags + count, 0)
