"""Routing of mixture-of-experts layers: the permute (a stable counting sort of the (token, slot) pairs by
expert, with each token quantized once and written to each of its rows) and the un-permute (the weighted
sum of a token's rows in slot order).

The sort takes three launches and no atomics, so its result is the same on every run: `moe_count_kernel`
counts each chunk's pairs per expert, `moe_scan_kernel` (one program) turns the counts into each chunk's
first rank per expert and the expert boundaries, and `moe_scatter_kernel` ranks each pair among the
earlier pairs of its chunk with the same expert, adds the chunk's first rank, and writes the pair's row.
A chunk is TOKENS tokens' k slots, padded to KP lanes; pairs are numbered t·k + j.

An expert id outside 0..E-1 drops its pair: it is counted nowhere and gets no row. Rows that hold no pair
get rows = -1 from extra programs of the scatter launch (they write only rows no pair takes, so the two
never race).
"""

import triton
import triton.language as tl

from .cast import load_f32, store_f32_as, to_f32
from .fp8 import nan_absmax
from .quant import block_scale, quantize


@triton.jit
def _chunk_experts(ids_ptr, chunk, T, E, stride_t, stride_j, K_TOP: tl.constexpr, TOKENS: tl.constexpr,
                   KP: tl.constexpr):
    """(expert of each pair of chunk `chunk` [TOKENS, KP] int32, -1 for a padding lane or an id outside
    0..E-1; the chunk's tokens [TOKENS]; the slots [KP])."""
    t = chunk * TOKENS + tl.arange(0, TOKENS)
    j = tl.arange(0, KP)
    inside = (t[:, None] < T) & (j[None, :] < K_TOP)
    raw = tl.load(ids_ptr + t[:, None].to(tl.int64) * stride_t + j[None, :] * stride_j, mask=inside, other=-1)
    # Compared before narrowing: an int64 id such as 2^32 + 1 must not wrap onto a real expert.
    ok = inside & (raw >= 0) & (raw < E)
    return tl.where(ok, raw, -1).to(tl.int32), t, j


@triton.jit
def moe_count_kernel(ids_ptr, counts_ptr, T, E, stride_t, stride_j, K_TOP: tl.constexpr, TOKENS: tl.constexpr,
                     KP: tl.constexpr, E_PAD: tl.constexpr):
    """counts[p, e] (int32 [P, E]): how many pairs of chunk p go to expert e."""
    p = tl.program_id(0)
    experts, _, _ = _chunk_experts(ids_ptr, p, T, E, stride_t, stride_j, K_TOP, TOKENS, KP)
    flat = tl.reshape(experts, (TOKENS * KP,))
    lanes = tl.arange(0, E_PAD)
    hits = (flat[:, None] == lanes[None, :]).to(tl.int32)
    tl.store(counts_ptr + p * E + lanes, tl.sum(hits, 0), mask=lanes < E)


@triton.jit
def moe_scan_kernel(counts_ptr, bounds_ptr, P, E, max_m, MASKED: tl.constexpr, P_BLOCK: tl.constexpr,
                    E_PAD: tl.constexpr):
    """One program: counts[p, e] becomes the number of expert e's pairs in chunks before p (in place), and
    bounds the experts' boundaries: contiguous, offsets [E + 1] (exclusive prefix sums of the totals);
    masked, masked_m [E] = min(total, max_m)."""
    lanes = tl.arange(0, E_PAD)
    running = tl.zeros([E_PAD], tl.int32)
    for p0 in range(0, P, P_BLOCK):
        chunks = p0 + tl.arange(0, P_BLOCK)
        inside = (chunks[:, None] < P) & (lanes[None, :] < E)
        ptrs = counts_ptr + chunks[:, None] * E + lanes[None, :]
        c = tl.load(ptrs, mask=inside, other=0)
        tl.store(ptrs, tl.cumsum(c, 0) - c + running[None, :], mask=inside)
        running += tl.sum(c, 0)
    if MASKED:
        tl.store(bounds_ptr + lanes, tl.minimum(running, max_m), mask=lanes < E)
    else:
        ends = tl.cumsum(running, 0)
        tl.store(bounds_ptr + 1 + lanes, ends, mask=lanes < E)
        tl.store(bounds_ptr + lanes, 0, mask=lanes == 0)


@triton.jit
def moe_scatter_kernel(x_ptr, ids_ptr, firsts_ptr, bounds_ptr, q_ptr, scale_ptr, rows_ptr, T, H, E, P, slots, max_m,
                       stride_x, stride_t, stride_j, eps, MASKED: tl.constexpr, K_TOP: tl.constexpr,
                       TOKENS: tl.constexpr, KP: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
                       CB: tl.constexpr, FILL: tl.constexpr, SRC: tl.constexpr, QFMT: tl.constexpr,
                       UE8M0: tl.constexpr, HW_FP8: tl.constexpr, TINY_SCALES: tl.constexpr):
    """Programs p < P: chunk p's pairs to their rows (rows[row] = t·k + j) and its tokens quantized per
    1×GROUP group, each token's codes q [slots, H] and scales [slots, ceil(H/GROUP)] written to each of its
    rows. Programs from P: rows = -1 in FILL rows each where no pair lands. MASKED: row = e·max_m + rank,
    pairs ranked max_m or later dropped; else row = offsets[e] + rank."""
    p = tl.program_id(0)
    if p >= P:
        s = (p - P) * FILL + tl.arange(0, FILL)
        inside = s < slots
        if MASKED:
            e = s // max_m
            used = s - e * max_m < tl.load(bounds_ptr + e, mask=inside, other=0)
        else:
            used = s < tl.load(bounds_ptr + E)
        tl.store(rows_ptr + s, -1, mask=inside & ~used)
    else:
        experts, t, j = _chunk_experts(ids_ptr, p, T, E, stride_t, stride_j, K_TOP, TOKENS, KP)
        PAIRS: tl.constexpr = TOKENS * KP
        flat = tl.reshape(experts, (PAIRS,))
        lane = tl.arange(0, PAIRS)
        kept = flat >= 0
        # The pair's rank in its expert: the chunk's earlier pairs of that expert, after the earlier chunks'.
        earlier = (flat[:, None] == flat[None, :]) & (lane[None, :] < lane[:, None])
        rank = tl.sum(earlier.to(tl.int32), 1) + tl.load(firsts_ptr + p * E + flat, mask=kept, other=0)
        if MASKED:
            kept = kept & (rank < max_m)
            row = flat * max_m + rank
        else:
            row = tl.load(bounds_ptr + flat, mask=kept, other=0) + rank
        row = tl.where(kept, row, -1)
        pair = tl.reshape(t[:, None] * K_TOP + j[None, :], (PAIRS,))
        tl.store(rows_ptr + row, pair, mask=kept)
        dest = tl.reshape(row, (TOKENS, KP))

        groups = tl.cdiv(H, GROUP)
        g = tl.arange(0, G_PAD)
        blocks = tl.arange(0, CB)
        token_ok = t < T
        for c0 in range(0, groups, CB):
            grp = c0 + blocks
            cols = grp[None, :, None] * GROUP + g[None, None, :]
            inside = token_ok[:, None, None] & (g[None, None, :] < GROUP) & (cols < H)
            x = load_f32(x_ptr + t[:, None, None].to(tl.int64) * stride_x + cols, inside, SRC)
            scale = block_scale(nan_absmax(x, 2), eps, QFMT, UE8M0, TINY_SCALES)
            codes = quantize(x, scale[:, :, None], QFMT, HW_FP8, UE8M0, TINY_SCALES)
            scale_ok = token_ok[:, None] & (grp[None, :] < groups)
            for jj in tl.static_range(K_TOP):
                # Slot jj's row of each token (one lane of `dest` matches).
                d = tl.sum(tl.where(j[None, :] == jj, dest, 0), 1).to(tl.int64)
                live = d >= 0
                tl.store(q_ptr + d[:, None, None] * H + cols, codes, mask=inside & live[:, None, None])
                tl.store(scale_ptr + d[:, None] * groups + grp[None, :], scale, mask=scale_ok & live[:, None])


@triton.jit
def moe_invert_kernel(rows_ptr, sources_ptr, slots, pairs, BLOCK: tl.constexpr):
    """sources[pair] = the row holding it, for each row holding a pair (a value in 0..pairs-1); the other
    entries of `sources` are left as they were (the gather checks every entry it reads)."""
    s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pair = tl.load(rows_ptr + s, mask=s < slots, other=-1)
    tl.store(sources_ptr + pair, s, mask=(pair >= 0) & (pair < pairs))


@triton.jit
def moe_gather_kernel(y_ptr, rows_ptr, sources_ptr, w_ptr, out_ptr, N, slots, stride_y, stride_wt, stride_wj,
                      stride_out, K_TOP: tl.constexpr, BLOCK_N: tl.constexpr, YKIND: tl.constexpr,
                      WKIND: tl.constexpr, OUT: tl.constexpr):
    """out[t, n-tile] = Σ_j w[t, j] · y[row of pair t·k + j] in fp32, j in order: each product rounded, then
    added (the launch compiles without contraction). sources[pair] is trusted only where rows[sources[pair]]
    names that pair back: an entry the invert kernel did not write (a dropped pair) holds whatever the
    memory held, and no row names its pair."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for jj in tl.static_range(K_TOP):
        pair = t * K_TOP + jj
        s = tl.load(sources_ptr + pair)
        inside = (s >= 0) & (s < slots)
        s = tl.where(inside, s, 0)
        held = inside & (tl.load(rows_ptr + s) == pair)
        w = to_f32(tl.load(w_ptr + t * stride_wt + jj * stride_wj), WKIND)
        # Row s is in range either way (0 for an entry out of it): a pair no row holds reads a row it discards.
        y = load_f32(y_ptr + s.to(tl.int64) * stride_y + n, n_ok, YKIND)
        acc = tl.where(held, acc + w * y, acc)
    store_f32_as(out_ptr + t.to(tl.int64) * stride_out + n, acc, n_ok, OUT)
