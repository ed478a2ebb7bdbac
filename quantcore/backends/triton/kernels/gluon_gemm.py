"""The block-scaled GEMM for Hopper (sm_90) in Gluon: warp-specialized, persistent, TMA-fed.

out[m, n] = Σ_kb dot_kb(a, b)[m, n] · a_s[m, kb] · b_s[n // SCALE_BN, kb], the same contract as
`gemm.py` (docs/numerics.md), with its epilogue: + bias, activation, cast to OUT.

Why a schedule of its own: in `gemm.py` every K block's wgmma must finish before its partial can be
scaled into the fp32 accumulator (the "promotion"), and Triton's block language runs that promotion
on the same warps, between one block's MMA and the next: the tensor cores wait for it. cuBLAS's
block-wise kernel and DeepGEMM hide it by giving the work to different warps. So does this kernel:

- Producer (one warp, `_produce`): walks this program's tiles and their K blocks and fills a ring
  of STAGES shared-memory slots with the A tile [BLOCK_M, BLOCK_K] and the B tile [BLOCK_N, BLOCK_K]
  (in boxes of SUB_N rows) through TMA (its zero fill masks the M, N and K tails), each slot guarded
  by a `ready` mbarrier (TMA transaction bytes) and an `empty` one (both consumers release it). For an
  epilogue in the consumers' registers it also stages each tile's bias in fp32 in shared memory
  (`_stage_bias`, two tiles' slots), so that no consumer holds or waits for a global load of it.
- Two consumer warpgroups (`_consume`, the default partition and a 4-warp worker), cooperative:
  both take the same tile and slot, consumer c the rows [c·BLOCK_M/2, (c+1)·BLOCK_M/2) of A, sharing
  the B tile. Per K block each issues one asynchronous wgmma into a fresh partial (FP8 -> fp32,
  INT8 -> int32, exact), releases the slot once it is complete and promotes the partial with one
  fp32 FMA per element. The warp schedulers interleave the two warpgroups, so that one's promotion
  runs on the CUDA cores while the other's wgmma runs on the tensor cores. With STAGGER, consumer 1 starts
  once consumer 0 has finished its first tile's main loop (`_consume`): their epilogues, which leave the
  tensor cores idle where they coincide, then fall apart. With PIPELINE each
  warpgroup also issues two K blocks' wgmmas at a time and promotes the first while the second runs
  (two partials in registers: 3 × 64 of the 232 a consumer thread gets at BLOCK_N = 128). Ping-pong
  (each warpgroup its own tile) would need a whole tile's accumulator and partial per warpgroup:
  at 128 × 128, 256 registers a thread, more than there are.
- Column sub-tiles (SUB_N < BLOCK_N): each K block is multiplied in BLOCK_N / SUB_N wgmmas of SUB_N
  columns, each into its own partial and promoted into its own accumulator, so that a wide tile needs
  two partials of SUB_N columns beside its accumulator, not two of BLOCK_N: at 128 × 256 in 64-column
  sub-tiles, 128 + 2 × 32 registers a thread. With PIPELINE each sub-tile's wgmma runs while the one
  before is promoted, one K block per step. A wider tile reads less of A and B per FLOP through L2
  (128 × 192: 17 % less, 128 × 256: 25 %), what cuBLAS gets from 2-CTA clusters multicasting the
  shared operand: Triton 3.6's Gluon launches clusters (num_ctas) but its TMA loads have no multicast
  (none is emitted even for a CTA-broadcast layout) and its mbarriers no remote arrive. Measured in CUDA C++
 , multicast brings a 128 × 128 tile to the wide tile's speed at long K and adds nothing to
  the wide tile.
- Persistent: one program per SM (the launch's grid), each walking tiles pid, pid + programs, ...
  in grouped order (GROUP_M row tiles share a column strip of b while it is in L2). The producer
  runs ahead into the next tile while the consumers run the epilogue. Where N's last column tile has
  column sub-tiles wholly past N (TAIL_NSUB: 128 × 256 at N = 2112 keeps one of four), that column's
  tiles come after all others, in loops of their own that load, multiply and store only the sub-tiles
  within N: a program with one tile more than others then mostly has a short one more.
- Grouped (E_PAD, the contiguous layout of mixture-of-experts layers): the same tiles over each expert's rows
  of a and its weight, numbered expert by expert (`_place`); each partition finds a tile's expert from the
  row offsets on the device with a scan in every warp, so a launch needs no host synchronization and no
  schedule of its own, and an expert's rows get the dense kernel's sums. Its output leaves with masked
  stores: a TMA box of a tile ending inside an expert would overwrite the next one's rows.
- Epilogue, per consumer warpgroup: + bias, activation, then the cast or a re-quantization per
  1×OUT_GROUP group of its rows (`quant.group_quantize`, the tiled kernel's own formulas: the same
  fp32 values give the same codes and scales; a group wider than a column sub-tile spans several, their
  amaxes combined before the one scale per row, `_requantized`). Without an activation, from the MMA's
  registers into shared memory and out through a TMA store that completes during the next tile's main
  loop (masked stores where the output's rows are not 16-byte aligned). With one (EPI_ROWS), the consumer hands
  its fp32 sub-tile over through shared memory to an epilogue partition of 4 warps (`_epilogue`), which
  runs it a few rows at a time in a loop with masked stores while the consumers go on to the next
  tile; each consumer runs the first own_steps steps itself, where the next main loop is too short
  to hide the partition's share (`gluon_launch.own_rows_for`). Unrolled over a thread's whole
  accumulator, in each consumer's copy of the code, an activation's code outgrew the instruction cache.
  A re-quantized output's scales with masked stores.

The activation scales are read per K block by the consumers (the contract allows any strides, so
they cannot come through TMA); each K block's loads are issued before its mbarrier wait, so that part of
their latency hides behind it. Where the producer runs ahead that wait is short: a K loop without scale
loads, wrong by design, ran FP8 0.3-3.5 % and INT8 4-9 % faster on the H200. With PRELOAD a tile's K block 0 scales
are loaded during the tile before, and K block 0 runs as a step of its own, out of the K loop: for a plain output
once that tile's main loop is done ("loop"), so that their latency passes in its epilogue; for a re-quantized one
once its stores are issued
("stores"; loaded where "loop" loads them, they gained less or lost). Neither is taken
with a bias, nor for a re-quantized output where a tile's K blocks fit the ring or N's last column has a
loop of its own: there both measured slower (`gluon_launch.preload`). The weight scale is one scalar per sub-tile
and K block when SCALE_BN is a multiple of SUB_N (folded into the row scale, as `gemm.py` does:
part · (a_s · b_s)), else one per column (part · a_s · b_s). FP8 wgmma adds products at reduced
precision within a K block, as Triton's tl.dot and cuBLAS do on Hopper
(registry.impl.REDUCED_FP8_ACCUMULATION).

Written against Triton 3.6's `triton.experimental.gluon` (and compiles with 3.9's); this module
imports it at its top and is imported only when the Gluon variant is launched.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                warpgroup_mma_wait)

from .cast import to_f32
from .epilogue import activate
from .fp8 import nan_absmax, nan_maximum
from .quant import block_scale, group_quantize, quantize

# Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global; later
# versions call them async_load / async_store (and keep the old names only to raise).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
# 3.6's name for the barrier of the calling partition's warps; later versions call it `barrier`.
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # later versions
    @gluon.jit
    def _in_steps(buf, STEPS: gl.constexpr):
        """`buf` [R, C] seen as [STEPS, R / STEPS, C], one step's rows per index."""
        return buf.reinterpret(buf.dtype, [STEPS, buf.shape[0] // STEPS, buf.shape[1]], buf.layout)
else:  # 3.6
    @gluon.jit
    def _in_steps(buf, STEPS: gl.constexpr):
        """`buf` [R, C] seen as [STEPS, R / STEPS, C], one step's rows per index."""
        return buf._reinterpret(buf.dtype, [STEPS, buf.shape[0] // STEPS, buf.shape[1]], buf.layout)


@gluon.jit
def _grouped(tile, M, col_tiles, BLOCK_M: gl.constexpr, GROUP_M: gl.constexpr):
    """(row tile, column tile) of the tile-th of col_tiles column tiles in grouped order, as `gemm.py` orders
    programs."""
    per_group = GROUP_M * col_tiles
    first_m = (tile // per_group) * GROUP_M
    size_m = gl.minimum(gl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    return first_m + (tile % per_group) % size_m, (tile % per_group) // size_m


@gluon.jit
def _dense_walk(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, TAIL_NSUB: gl.constexpr):
    """(whole, tiles) of an M×N output's tiles in `_tile`'s order: the first `whole` in grouped order, the rest (with
    TAIL_NSUB, N's last column) after them."""
    tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    whole = tiles - gl.cdiv(M, BLOCK_M) if TAIL_NSUB else tiles
    return whole, tiles


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _experts(params, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, E_PAD: gl.constexpr, WARPS: gl.constexpr):
    """The grouped GEMM's tiles per expert, from its offsets [E + 1] (`params`): per lane of E_PAD (0 past E) the
    expert's tiles and the end of its tiles in `_place`'s numbering (their running sum), and the tiles of all.
    Every warp of the calling partition's WARPS holds every lane (the layout repeats over the warps), so that the
    scan and the reductions of `_place` stay within a warp: no shared memory, no barrier between the partition's
    warps. A few hundred bytes, from L1 after a program's first tile."""
    N, rows_ptr, E = params[6], params[17], params[18]
    lane = gl.arange(0, E_PAD, layout=gl.BlockedLayout([E_PAD // 32], [32], [WARPS], [0]))
    rows = gl.load(rows_ptr + lane + 1, mask=lane < E, other=0) - gl.load(rows_ptr + lane, mask=lane < E, other=0)
    tiles = gl.cdiv(rows, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    ends = gl.associative_scan(tiles, 0, _add)
    return tiles, ends, gl.max(ends, 0)


@gluon.jit
def _walk(params, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, TAIL_NSUB: gl.constexpr, E_PAD: gl.constexpr,
          WARPS: gl.constexpr):
    """(whole, tiles) of the output's tiles in `_place`'s order: the first `whole` in grouped order, the rest (with
    TAIL_NSUB, N's last column) after them; with E_PAD (grouped), every expert's tiles (`_experts`), all whole."""
    if E_PAD:
        _tiles, _ends, tiles = _experts(params, BLOCK_M, BLOCK_N, E_PAD, WARPS)
        whole = tiles
    else:
        whole, tiles = _dense_walk(params[5], params[6], BLOCK_M, BLOCK_N, TAIL_NSUB)
    return whole, tiles


@gluon.jit
def _tile(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, TAIL_NSUB: gl.constexpr):
    """(row tile, column tile) of the tile-th tile: in grouped order; with TAIL_NSUB (N's last column tile part
    empty, its sub-tiles past N skipped: `_consume`) the whole column tiles first, then the last column's, so that
    the programs of one more tile than others are the ones whose extra tile is the short one."""
    if TAIL_NSUB:
        whole, _tiles = _dense_walk(M, N, BLOCK_M, BLOCK_N, TAIL_NSUB)
        full_n = N // BLOCK_N
        pid_m = tile - whole
        pid_n = full_n
        if tile < whole:
            pid_m, pid_n = _grouped(tile, M, full_n, BLOCK_M, GROUP_M)
    else:
        pid_m, pid_n = _grouped(tile, M, gl.cdiv(N, BLOCK_N), BLOCK_M, GROUP_M)
    return pid_m, pid_n


@gluon.jit
def _place(tile, params, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
           TAIL_NSUB: gl.constexpr, E_PAD: gl.constexpr, WARPS: gl.constexpr):
    """(row, end, pid_n, e) of the tile-th tile of the walk: its rows of a and out are row … min(row + BLOCK_M,
    end) - 1, its columns column tile pid_n's, of expert e's weight. Dense (E_PAD 0): `_tile`'s (pid_m, pid_n),
    end M, expert 0. Grouped: the tiles numbered expert by expert, inside an expert in `_grouped` order over its
    rows (the order of `grouped.py`'s programs), end the expert's last row + 1. A tile index below 0 (the walk
    of no tiles) reads as tile 0."""
    if E_PAD:
        tiles, ends, _total = _experts(params, BLOCK_M, BLOCK_N, E_PAD, WARPS)
        tile = gl.maximum(tile, 0)
        # The experts whose tiles end at or before this one come before it (ends never decrease); past the last
        # tile (no rows at all) the last expert, whose rows are then none.
        before = ends <= tile
        e = gl.minimum(gl.sum(before.to(gl.int32), 0), params[18] - 1)
        local = tile - gl.sum(gl.where(before, tiles, 0), 0)
        row = gl.load(params[17] + e)
        count = gl.load(params[17] + e + 1) - row
        pid_m, pid_n = _grouped(local, gl.maximum(count, 1), gl.cdiv(params[6], BLOCK_N), BLOCK_M, GROUP_M)
        place = (row + pid_m * BLOCK_M, row + count, pid_n, e)
    else:
        pid_m, pid_n = _tile(tile, params[5], params[6], BLOCK_M, BLOCK_N, GROUP_M, TAIL_NSUB)
        place = (pid_m * BLOCK_M, params[5], pid_n, 0)
    return place


@gluon.jit
def _stage_bias(bias_ptr, stride_bias, col0, N, bias_smem, bias_ready, bias_free, t, BIAS: gl.constexpr):
    """Producer side of a tile's bias: columns col0 … col0 + BLOCK_N of kind BIAS, in fp32 (0 past N), into slot
    t % 2 of bias_smem [2·NSUB, SUB_N] (sub-tile j of slot s at index s·NSUB + j) once both consumers have freed
    it, then signalled on bias_ready. Converted here, once per element: in the consumers, each of their threads
    converted the 16 elements of a 64-column sub-tile it holds."""
    NSUB: gl.constexpr = bias_smem.type.shape[0] // 2
    SUB_N: gl.constexpr = bias_smem.type.shape[1]
    slot = t % 2
    # A fresh mbarrier counts as having completed the phase before its first: the first two tiles do not wait.
    mbarrier.wait(bias_free.index(slot), ((t // 2) & 1) ^ 1)
    for j in gl.static_range(NSUB):
        cols = col0 + j * SUB_N + gl.arange(0, SUB_N, layout=gl.BlockedLayout([1], [32], [1], [0]))
        bias = gl.load(bias_ptr + cols * stride_bias, mask=cols < N, other=0)
        bias_smem.index(slot * NSUB + j).store(to_f32(bias, BIAS))
    _barrier()  # every lane's stores land before the one arrival
    mbarrier.arrive(bias_ready.index(slot), count=1)


@gluon.jit
def _next_tile(start):
    """The first of this program's tiles (pid, pid + programs, ...) from the start-th on."""
    pid = gl.program_id(0)
    return pid + gl.cdiv(gl.maximum(start - pid, 0), gl.num_programs(0)) * gl.num_programs(0)


@gluon.jit
def _load_tile(a_desc, b_desc, ring, a_row, b_row, K, it, LIVE: gl.constexpr):
    """Every K block of the tile whose rows start at row a_row of A and b_row of B into the slot ring (`ring`:
    a_bufs, b_bufs, ready, empty), from the it-th slot of this program on: A's rows whole, B's first LIVE column
    sub-tiles' boxes (the rest of the slot is not read); returns the next `it`."""
    a_bufs, b_bufs, ready, empty, _stagger_bar = ring
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    SUB_N: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    NSUB: gl.constexpr = b_bufs.type.shape[0] // STAGES
    for kb in range(gl.cdiv(K, BLOCK_K)):
        slot = it % STAGES
        # A fresh mbarrier counts as having completed the phase before its first: the first pass
        # over the ring does not wait.
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        # Bytes filled with zeros past the tensor's edge count too: the expected total is fixed.
        mbarrier.expect(bar, a_desc.block_type.nbytes + LIVE * b_desc.block_type.nbytes)
        _tma_load(a_desc, [a_row, kb * BLOCK_K], bar, a_bufs.index(slot))
        for j in gl.static_range(LIVE):
            _tma_load(b_desc, [b_row + j * SUB_N, kb * BLOCK_K], bar, b_bufs.index(slot * NSUB + j))
        it += 1
    return it


@gluon.jit
def _produce(a_desc, b_desc, ring, bias_stage, params, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
             BIAS: gl.constexpr, BIAS_SMEM: gl.constexpr, TAIL_NSUB: gl.constexpr, E_PAD: gl.constexpr):
    """The load partition: every K block of every tile of this program into the slot ring (`ring`: a_bufs,
    b_bufs, ready, empty), in the order the consumers take them (`_load_tile`; with TAIL_NSUB, N's last column
    tile's first TAIL_NSUB sub-tiles only; grouped, expert e's B rows from e·N on); with BIAS_SMEM, after each
    tile's K blocks, its bias (of kind BIAS) into bias_stage's shared memory (`_stage_bias`). `params` as the
    consumers'."""
    bias_smem, bias_ready, bias_free = bias_stage
    _a_s, _b_s, bias_ptr, _out, _out_s, _M, N, K, _sam, _sak, _sbn, _sbk, stride_bias, _som, _sos, _eps, _own, \
        _rows, _E, _sbe, stride_biase = params
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    NSUB: gl.constexpr = BLOCK_N // b_desc.block_type.shape[0]
    it = 0
    t = 0  # this program's tiles so far
    # As the consumers walk them (`_consume`): with TAIL_NSUB, the last column's tiles in a loop of their own.
    whole, tiles = _walk(params, BLOCK_M, BLOCK_N, TAIL_NSUB, E_PAD, 1)
    for tile in range(gl.program_id(0), whole, gl.num_programs(0)):
        row, _end, pid_n, e = _place(tile, params, BLOCK_M, BLOCK_N, GROUP_M, TAIL_NSUB, E_PAD, 1)
        it = _load_tile(a_desc, b_desc, ring, row, e * N + pid_n * BLOCK_N, K, it, NSUB)
        if BIAS_SMEM:
            # Here the ring is full of this tile's K blocks: the loads' latency stalls this warp, not the consumers,
            # and the bias lands long before their epilogue.
            _stage_bias(bias_ptr + e * stride_biase, stride_bias, pid_n * BLOCK_N, N, bias_smem, bias_ready,
                        bias_free, t, BIAS)
        t += 1
    if TAIL_NSUB:
        for tile in range(_next_tile(whole), tiles, gl.num_programs(0)):
            row, _end, pid_n, _e = _place(tile, params, BLOCK_M, BLOCK_N, GROUP_M, TAIL_NSUB, 0, 1)
            it = _load_tile(a_desc, b_desc, ring, row, pid_n * BLOCK_N, K, it, TAIL_NSUB)
            if BIAS_SMEM:
                _stage_bias(bias_ptr, stride_bias, pid_n * BLOCK_N, N, bias_smem, bias_ready, bias_free, t, BIAS)
            t += 1


@gluon.jit
def _set(items, i: gl.constexpr, value):
    """The tuple `items` with its i-th element replaced by `value`."""
    return items[:i] + (value, ) + items[i + 1:]


@gluon.jit
def _k_scales(a_s_ptrs, b_s_ptrs, kb, stride_ask, stride_bsk):
    """K block kb's activation scales (one per row) and, per column sub-tile, its weight scales (a
    scalar or one per column)."""
    b_s = ()
    for j in gl.static_range(len(b_s_ptrs)):
        b_s = b_s + (gl.load(b_s_ptrs[j] + kb * stride_bsk), )
    return gl.load(a_s_ptrs + kb * stride_ask), b_s


@gluon.jit
def _issue(a_bufs, b_bufs, ready, it, zero, C: gl.constexpr, J: gl.constexpr):
    """Start this warpgroup's wgmma on its rows of the it-th K block and columns [J·SUB_N, (J+1)·SUB_N)
    of the tile, waiting for the K block's slot first when J is 0."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    ROWS: gl.constexpr = zero.shape[0]
    NSUB: gl.constexpr = b_bufs.type.shape[0] // STAGES
    slot = it % STAGES
    if J == 0:
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    a = a_bufs.index(slot).slice(C * ROWS, ROWS)
    return warpgroup_mma(a, b_bufs.index(slot * NSUB + J).permute((1, 0)), zero, use_acc=False, is_async=True)


@gluon.jit
def _retire(acc, part, a_s, b_s, empty, it, PENDING: gl.constexpr, RELEASE: gl.constexpr,
            UNIFORM_BS: gl.constexpr):
    """Wait for a wgmma of the it-th K block (PENDING later ones may stay in flight), release the K
    block's slot when it was its last (RELEASE) and return acc + fp32(part) · a_s[m] · b_s[n], the
    scale product formed as `gemm.py` forms it."""
    STAGES: gl.constexpr = empty.type.shape[0]
    part = warpgroup_mma_wait(num_outstanding=PENDING, deps=[part])
    if RELEASE:
        mbarrier.arrive(empty.index(it % STAGES), count=1)
    if UNIFORM_BS:
        return acc + part.to(gl.float32) * (a_s * b_s)[:, None]
    else:
        return acc + part.to(gl.float32) * a_s[:, None] * b_s[None, :]


@gluon.jit
def _promote(accs, part, scales, empty, it, G: gl.constexpr, PENDING: gl.constexpr, UNIFORM_BS: gl.constexpr):
    """`_retire` group G of a step (K block it + G // NSUB, sub-tile G % NSUB) into its accumulator."""
    NSUB: gl.constexpr = len(accs)
    K: gl.constexpr = G // NSUB
    J: gl.constexpr = G % NSUB
    a_s, b_s = scales[K]
    return _set(accs, J, _retire(accs[J], part, a_s, b_s[J], empty, it + K, PENDING, J == NSUB - 1, UNIFORM_BS))


@gluon.jit
def _step(accs, a_bufs, b_bufs, ready, empty, it, scales, zero, C: gl.constexpr, UNIFORM_BS: gl.constexpr,
          OVERLAP: gl.constexpr):
    """len(scales) K blocks (it, ... of this program; `scales` theirs, as `_k_scales` gives them) into the
    sub-tile accumulators `accs`: one wgmma per K block and sub-tile, in that order. OVERLAP: each is issued
    before the one before it is promoted (two sub-tile partials in registers), else after."""
    NSUB: gl.constexpr = len(accs)
    KSTEP: gl.constexpr = len(scales)
    part = _issue(a_bufs, b_bufs, ready, it, zero, C, 0)
    for g in gl.static_range(1, KSTEP * NSUB):
        # Group g (K block g // NSUB, sub-tile g % NSUB) is issued, group g - 1 promoted.
        if OVERLAP:
            nxt = _issue(a_bufs, b_bufs, ready, it + g // NSUB, zero, C, g % NSUB)
            accs = _promote(accs, part, scales, empty, it, g - 1, 1, UNIFORM_BS)
            part = nxt
        else:
            accs = _promote(accs, part, scales, empty, it, g - 1, 0, UNIFORM_BS)
            part = _issue(a_bufs, b_bufs, ready, it + g // NSUB, zero, C, g % NSUB)
    return _promote(accs, part, scales, empty, it, KSTEP * NSUB - 1, 0, UNIFORM_BS)


@gluon.jit
def _mainloop(a_bufs, b_bufs, ready, empty, it, num_kb, a_s_ptrs, b_s_ptrs, stride_ask, stride_bsk, first, zero,
              C: gl.constexpr, UNIFORM_BS: gl.constexpr, PIPELINE: gl.constexpr, FIRST: gl.constexpr):
    """One tile's fp32 accumulators, one per column sub-tile, over its num_kb K blocks, the first being
    the it-th of this program. Each K block's scales are loaded before its mbarrier wait, which hides part
    of their latency; with FIRST (column sub-tiles only) K block 0's are `first`, loaded during the tile
    before (`_tile_work`'s PRELOAD), and K block 0 runs as a step of its own ahead of the K loop."""
    NSUB: gl.constexpr = len(b_s_ptrs)
    accs = ()
    for j in gl.static_range(NSUB):
        accs = accs + (gl.zeros_like(zero, dtype=gl.float32), )
    if PIPELINE and NSUB == 1:
        # Two K blocks per step, the second's wgmma running while the first is promoted. No wgmma stays
        # in flight across the loop's back edge: a loop-carried in-flight accumulator is copied there,
        # and ptxas then serializes every wgmma (its warning C7514/C7515).
        for kb in range(0, num_kb - 1, 2):
            scales = (_k_scales(a_s_ptrs, b_s_ptrs, kb, stride_ask, stride_bsk),
                      _k_scales(a_s_ptrs, b_s_ptrs, kb + 1, stride_ask, stride_bsk))
            accs = _step(accs, a_bufs, b_bufs, ready, empty, it, scales, zero, C, UNIFORM_BS, True)
            it += 2
        if num_kb % 2 == 1:
            scales = (_k_scales(a_s_ptrs, b_s_ptrs, num_kb - 1, stride_ask, stride_bsk), )
            accs = _step(accs, a_bufs, b_bufs, ready, empty, it, scales, zero, C, UNIFORM_BS, True)
            it += 1
    else:
        # One K block per step; pipelined, each sub-tile's wgmma runs while the one before is promoted.
        # (Steps of two K blocks in several sub-tiles spill accumulators under ptxas, measured at
        # BLOCK_N = 192 and 256 in 64-column sub-tiles.)
        if FIRST:
            accs = _step(accs, a_bufs, b_bufs, ready, empty, it, (first, ), zero, C, UNIFORM_BS, PIPELINE)
            it += 1
        for kb in range(1 if FIRST else 0, num_kb):
            scales = (_k_scales(a_s_ptrs, b_s_ptrs, kb, stride_ask, stride_bsk), )
            accs = _step(accs, a_bufs, b_bufs, ready, empty, it, scales, zero, C, UNIFORM_BS, PIPELINE)
            it += 1
    return accs, it


@gluon.jit
def _b_scale_ptrs(b_scale_ptr, pid_n, N, stride_bsn, zero, SCALE_BN: gl.constexpr, NSUB: gl.constexpr,
                  LIVE: gl.constexpr, UNIFORM_BS: gl.constexpr):
    """Per column sub-tile of column tile pid_n (NSUB of them), its first LIVE, a pointer to its K block 0 weight
    scale (UNIFORM_BS: the sub-tile lies within one scale block), else one per column."""
    SUB_N: gl.constexpr = zero.shape[1]
    ptrs = ()
    for j in gl.static_range(LIVE):
        col0 = (pid_n * NSUB + j) * SUB_N
        if UNIFORM_BS:
            # A sub-tile wholly past N (a tile wider than N's tail) reads the last scale row: never stored.
            ptrs = ptrs + (b_scale_ptr + (gl.minimum(col0, N - 1) // SCALE_BN) * stride_bsn, )
        else:
            cols = col0 + gl.arange(0, SUB_N, layout=gl.SliceLayout(0, zero.type.layout))
            # Tail columns wrap back into range: their loads need no mask, and they are never stored.
            ptrs = ptrs + (b_scale_ptr + ((cols % N) // SCALE_BN) * stride_bsn, )
    return ptrs


@gluon.jit
def _scale_ptrs(params, place, zero, C: gl.constexpr, SCALE_BN: gl.constexpr, NSUB: gl.constexpr,
                LIVE: gl.constexpr):
    """Consumer C's pointers to the K block 0 scales of the tile at `place` (`_place`): its rows' activation scales
    and the weight scales of the first LIVE of the tile's NSUB column sub-tiles (`_b_scale_ptrs`), expert e's."""
    a_scale_ptr, b_scale_ptr, _bias, _out, _out_s, M, N, _K, stride_asm, _sak, stride_bsn, _sbk, _sb, _som, _sos, \
        _eps, _own, _rows, _E, stride_bse, _sbie = params
    row, _end, pid_n, e = place
    ROWS: gl.constexpr = zero.shape[0]
    rows = row + C * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, zero.type.layout))
    # Tail rows wrap back into range: their scale loads need no mask, and they are never stored.
    b_s_ptrs = _b_scale_ptrs(b_scale_ptr + e * stride_bse, pid_n, N, stride_bsn, zero, SCALE_BN, NSUB, LIVE,
                             SCALE_BN % zero.shape[1] == 0)
    return a_scale_ptr + (rows % M) * stride_asm, b_s_ptrs


@gluon.jit
def _first_scales(params, place, zero, C: gl.constexpr, SCALE_BN: gl.constexpr, NSUB: gl.constexpr):
    """Consumer C's K block 0 scales of the tile at `place`, all its NSUB column sub-tiles' (`_k_scales`)."""
    stride_ask, stride_bsk = params[9], params[11]
    a_s_ptrs, b_s_ptrs = _scale_ptrs(params, place, zero, C, SCALE_BN, NSUB, NSUB)
    return _k_scales(a_s_ptrs, b_s_ptrs, 0, stride_ask, stride_bsk)


@gluon.jit
def _store_scales(out_scale_ptr, scale, row0, col0, M, N, stride_osm, OUT_GROUP: gl.constexpr):
    """A re-quantized sub-tile's scales [ROWS, GROUPS] (rows from row0, columns from col0) into
    out_scale [M, ceil(N/OUT_GROUP)], in the layout the group reduction left them in."""
    ROWS: gl.constexpr = scale.shape[0]
    GROUPS: gl.constexpr = scale.shape[1]
    layout: gl.constexpr = scale.type.layout
    rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    groups = col0 // OUT_GROUP + gl.arange(0, GROUPS, layout=gl.SliceLayout(0, layout))
    mask = (rows < M)[:, None] & (groups < gl.cdiv(N, OUT_GROUP))[None, :]
    gl.store(out_scale_ptr + rows[:, None] * stride_osm + groups[None, :], scale, mask=mask)


@gluon.jit
def _bias_cols(bias_ptr, stride_bias, col0, N, SUB_N: gl.constexpr, BIAS: gl.constexpr, layout: gl.constexpr):
    """The bias elements of columns col0 … col0 + SUB_N as stored (bf16 as int16 bits; 0 past N) in the 1-D
    `layout`; 0 without a bias."""
    if BIAS == "none":
        bias = 0
    else:
        cols = col0 + gl.arange(0, SUB_N, layout=layout)
        bias = gl.load(bias_ptr + cols * stride_bias, mask=cols < N, other=0)
    return bias


@gluon.jit
def _staged_bias(bias_smem, t, j: gl.constexpr, BIAS: gl.constexpr, layout: gl.constexpr):
    """Consumer side: column sub-tile j's bias of this program's t-th tile as `_stage_bias` stored it (fp32),
    in the 1-D `layout`; 0 without a bias."""
    if BIAS == "none":
        bias = 0
    else:
        bias = bias_smem.index((t % 2) * (bias_smem.type.shape[0] // 2) + j).load(layout)
    return bias


# Two fp32 ($1, $2) -> their bf16 bits packed ($1's low), rounded to nearest even, each NaN as 0x7FC0: the
# conversion, a per-half NaN mask and one LOP3 that selects 0x7FC0 under it ((a & ~m) | (c & m): 0xB8).
_BF16X2 = gl.constexpr("""{
.reg .b32 m;
cvt.rn.bf16x2.f32 $0, $2, $1;
set.nan.u32.bf16x2 m, $0, $0;
lop3.b32 $0, $0, m, 0x7FC07FC0, 0xB8;
}""")


@gluon.jit
def _bf16_bits(x):
    """fp32 -> bf16 bits (int16), round to nearest even, NaN -> 0x7FC0: `cast.bf16_encode`'s bits through the
    hardware's conversion, three instructions per two elements (`_BF16X2`). The integer route took about
    seven an element; the conversion with an fp32 NaN test and select per element, and the repacking of the
    selected halves, about four (Triton 3.9's SASS): the epilogue runs while the tensor cores wait, so each
    costs time. Gluon kernels never run in the interpreter, whose bf16 cast truncates."""
    return gl.inline_asm_elementwise(_BF16X2, "=r,r,r", [x], dtype=gl.int16, is_pure=True, pack=2)


@gluon.jit
def _activated(acc, row0, col0, M, N, bias, BIAS: gl.constexpr, ACTIVATION: gl.constexpr, QUANTIZED: gl.constexpr,
               GROUP_TAIL: gl.constexpr):
    """(values, rows, columns, mask) of `acc` [R, C] fp32 (any layout) at output rows row0…, columns col0…,
    + bias (its C elements of kind BIAS as `_bias_cols` or, in fp32, `_staged_bias` gave them, in any layout),
    activated; where QUANTIZED and a group crosses N (GROUP_TAIL), zero past N, so that those columns never
    reach its amax."""
    layout: gl.constexpr = acc.type.layout
    rows = row0 + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    if BIAS != "none":
        # Converted to fp32 before its layout: one conversion per element loaded, not per element held.
        acc = acc + gl.convert_layout(to_f32(bias, BIAS), gl.SliceLayout(0, layout))[None, :]
    acc = activate(acc, ACTIVATION)
    if QUANTIZED and GROUP_TAIL:
        # Rows past M need no mask: a group lies within one row, and theirs are never stored. Nor do columns
        # past N where N is a multiple of the group: their groups lie wholly past N. (Two selects an element,
        # of about eleven instructions an FP8 element's re-quantization takes.)
        acc = gl.where((cols < N)[None, :], acc, 0.0)
    return acc, rows, cols, mask


@gluon.jit
def _finished(acc, row0, col0, M, N, bias, out_scale_ptr, stride_osm, eps, BIAS: gl.constexpr,
              ACTIVATION: gl.constexpr, OUT: gl.constexpr, OUT_GROUP: gl.constexpr, UE8M0_OUT: gl.constexpr,
              GROUP_TAIL: gl.constexpr, TINY_SCALES: gl.constexpr):
    """(values to store, rows, columns, mask) of the epilogue of `acc` [R, C] fp32 (any layout) at
    output rows row0…, columns col0…: `_activated`, then the cast or the re-quantization per 1×OUT_GROUP,
    OUT_GROUP dividing C (its scales stored here)."""
    QUANTIZED: gl.constexpr = OUT == "fp8" or OUT == "int8"
    acc, rows, cols, mask = _activated(acc, row0, col0, M, N, bias, BIAS, ACTIVATION, QUANTIZED, GROUP_TAIL)
    if QUANTIZED:
        # The codes come back to acc's layout (the reshapes' round trip: no data moves) for the stores.
        res, scale = group_quantize(acc, eps, OUT_GROUP, OUT, UE8M0_OUT, True, TINY_SCALES)
        res = gl.convert_layout(res, acc.type.layout)
        _store_scales(out_scale_ptr, scale, row0, col0, M, N, stride_osm, OUT_GROUP)
    elif OUT == "bf16":
        res = _bf16_bits(acc)
    else:
        res = acc
    return res, rows, cols, mask


@gluon.jit
def _requantized(accs, biases, g: gl.constexpr, row0, col0, M, N, out_scale_ptr, stride_osm, eps, BIAS: gl.constexpr,
                 ACTIVATION: gl.constexpr, OUT: gl.constexpr, OUT_GROUP: gl.constexpr, UE8M0_OUT: gl.constexpr,
                 GROUP_TAIL: gl.constexpr, TINY_SCALES: gl.constexpr):
    """The re-quantized epilogue of group g of column sub-tiles, OUT_GROUP wider than one (SPAN of them, the
    group's first at output column col0, their bias elements `biases`: one per sub-tile, fewer than SPAN where
    the rest lie past N and were skipped): per sub-tile of `accs` (fp32 [R, SUB_N], in the MMA's layout)
    `_activated`, one scale per row from their joint amax (stored here), and per sub-tile (codes, rows,
    columns, mask). The same formulas on the same values as `quant.group_quantize` over the whole group (the
    columns past N are zeros to it, which leave the amax as it is)."""
    SUB_N: gl.constexpr = accs[0].shape[1]
    SPAN: gl.constexpr = OUT_GROUP // SUB_N
    vals = ()
    for i in gl.static_range(len(biases)):
        vals = vals + (_activated(accs[g * SPAN + i], row0, col0 + i * SUB_N, M, N, biases[i], BIAS,
                                  ACTIVATION, True, GROUP_TAIL), )
    amax = nan_absmax(vals[0][0], 1)
    for i in gl.static_range(1, len(vals)):
        amax = nan_maximum(amax, nan_absmax(vals[i][0], 1))
    scale = block_scale(amax, eps, OUT, UE8M0_OUT, TINY_SCALES)
    # Stored from its own 1-D layout: widened to [R, 1] in the MMA's, each thread held 16 copies of its rows'
    # scales and stored every one (2.1 M store instructions against 0.26 M at 4096×32768×512, Nsight Compute).
    rows = row0 + gl.arange(0, scale.shape[0], layout=scale.type.layout)
    gl.store(out_scale_ptr + rows * stride_osm + col0 // OUT_GROUP, scale, mask=(rows < M) & (col0 < N))
    done = ()
    for i in gl.static_range(len(vals)):
        v, rows, cols, mask = vals[i]
        done = done + ((quantize(v, scale[:, None], OUT, True, UE8M0_OUT, TINY_SCALES), rows, cols, mask), )
    return done


@gluon.jit
def _hand_over(acc, scratch, free, ready, h):
    """Consumer side of the staged epilogue: the h-th sub-tile `acc` [ROWS, SUB_N] fp32 into `scratch`
    once the epilogue partition has freed it, then signalled `ready`."""
    # A fresh mbarrier counts as having completed the phase before its first: the first hand-over
    # does not wait.
    mbarrier.wait(free, (h & 1) ^ 1)
    scratch.store(acc)
    _barrier()  # every thread's stores land before the one arrival
    mbarrier.arrive(ready, count=1)


@gluon.jit
def _staged_rows(scratch, first, last, row0, col0, M, N, bias_ptr, stride_bias, out_ptr, stride_om, out_scale_ptr,
                 stride_osm, eps, BIAS: gl.constexpr, ACTIVATION: gl.constexpr, OUT: gl.constexpr,
                 OUT_GROUP: gl.constexpr, UE8M0_OUT: gl.constexpr, GROUP_TAIL: gl.constexpr, TINY_SCALES: gl.constexpr,
                 EPI_ROWS: gl.constexpr):
    """The epilogue of steps [first, last) of a consumer's sub-tile in `scratch` (fp32 [ROWS, SUB_N],
    output rows row0…, columns col0…), EPI_ROWS rows a step in a loop that stays a loop, with masked
    stores, by the calling partition's 4 warps."""
    ROWS: gl.constexpr = scratch.shape[0]
    SUB_N: gl.constexpr = scratch.shape[1]
    STEPS: gl.constexpr = ROWS // EPI_ROWS
    # A warp per row, SUB_N / 32 consecutive columns a thread: coalesced stores, a group within a row.
    layout: gl.constexpr = gl.BlockedLayout([1, SUB_N // 32], [1, 32], [4, 1], [1, 0])
    # A shared-memory view takes a loop's index as an index, not as a slice's start. Its swizzle's
    # phase is the row mod 8: the same in the view where EPI_ROWS is a multiple of 8.
    steps = _in_steps(scratch, STEPS)
    for i in range(first, last):
        # The bias is loaded again each step (from L1 after the first): kept across the loop, its registers
        # made the epilogue partition's 56 spill (8 bytes, offline under Triton 3.9's ptxas).
        bias = _bias_cols(bias_ptr, stride_bias, col0, N, SUB_N, BIAS, gl.SliceLayout(0, layout))
        res, rows, cols, mask = _finished(steps.index(i).load(layout), row0 + i * EPI_ROWS, col0, M, N, bias,
                                          out_scale_ptr, stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP,
                                          UE8M0_OUT, GROUP_TAIL, TINY_SCALES)
        gl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], res.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _epilogue(c_smem, acc_ready, acc_free, params, BIAS: gl.constexpr, ACTIVATION: gl.constexpr, OUT: gl.constexpr,
              OUT_GROUP: gl.constexpr, UE8M0_OUT: gl.constexpr, GROUP_TAIL: gl.constexpr, TINY_SCALES: gl.constexpr,
              BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, EPI_ROWS: gl.constexpr, E_PAD: gl.constexpr):
    """The epilogue partition (EPI_ROWS > 0): of every sub-tile the consumers hand over through c_smem
    (per consumer one fp32 [BLOCK_M / 2, SUB_N] buffer), in the consumers' order, the steps from
    own_steps on (`_staged_rows`), while the consumers run their own first own_steps and then the next
    sub-tile's or tile's main loop. Applied to the MMA's registers in the consumers, an activation's
    code was unrolled over every element a thread holds (64 at 128 × 128, in each consumer's copy;
    under ncu the GELU kernel's warps spent 42 % of their stall samples waiting for instructions,
    on the H100)."""
    _a_s, _b_s, bias_ptr, out_ptr, out_scale_ptr, _M, N, _K, _sam, _sak, _sbn, _sbk, stride_bias, stride_om, \
        stride_osm, eps, own_steps, _rows, _E, _sbe, stride_biase = params
    ROWS: gl.constexpr = c_smem.type.shape[1]
    SUB_N: gl.constexpr = c_smem.type.shape[2]
    BLOCK_M: gl.constexpr = 2 * ROWS
    h = 0
    _whole, tiles = _walk(params, BLOCK_M, BLOCK_N, 0, E_PAD, 4)  # no TAIL_NSUB beside this partition
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        row, end, pid_n, e = _place(tile, params, BLOCK_M, BLOCK_N, GROUP_M, 0, E_PAD, 4)
        for j in gl.static_range(BLOCK_N // SUB_N):
            for c in gl.static_range(2):
                mbarrier.wait(acc_ready.index(c), h & 1)
                _staged_rows(c_smem.index(c), own_steps, ROWS // EPI_ROWS, row + c * ROWS, pid_n * BLOCK_N + j * SUB_N,
                             end, N, bias_ptr + e * stride_biase, stride_bias, out_ptr, stride_om, out_scale_ptr,
                             stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, GROUP_TAIL, TINY_SCALES,
                             EPI_ROWS)
                _barrier()  # every row read before the buffer is handed back
                mbarrier.arrive(acc_free.index(c), count=1)
            h += 1


@gluon.jit
def _tile_work(work, at, C: gl.constexpr, SCALE_BN: gl.constexpr, BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
               OUT: gl.constexpr, OUT_GROUP: gl.constexpr, UE8M0_OUT: gl.constexpr, GROUP_TAIL: gl.constexpr,
               TINY_SCALES: gl.constexpr, PIPELINE: gl.constexpr, TMA_OUT: gl.constexpr, EPI_ROWS: gl.constexpr,
               STAGGER: gl.constexpr, BLOCK_N: gl.constexpr, LIVE: gl.constexpr, PRELOAD: gl.constexpr):
    """Consumer warpgroup C's share of one tile, as `_consume` says (`work`: its ring, out_desc, epi_smem,
    bias_stage and params): the main loop over num_kb K blocks and the tile's first LIVE column sub-tiles (all
    of them, but on N's last column tile, whose sub-tiles past N are skipped) from the it-th slot on, then their
    epilogue, the TMA stores taken only with all sub-tiles (their buffers are taken in turn by whole tiles).
    `at`: (it, h, t, num_kb, place, zero, first, nxt) of `_consume`'s loop: `place` the tile's (`_place`: rows from
    row to end, column tile pid_n, expert e); with PRELOAD ("loop" or "stores", else "none"), `first` this tile's K
    block 0 scales (`_k_scales`, all BLOCK_N / SUB_N sub-tiles' weight scales) and `nxt` the place of this program's
    next tile, whose K block 0 scales are loaded once the main loop is done ("loop") or once the epilogue's stores
    are issued ("stores"). Returns the next (it, h, first)."""
    ring, out_desc, epi_smem, bias_stage, params = work
    it, h, t, num_kb, place, zero, first, nxt = at
    _a_s, _b_s, bias_ptr, out_ptr, out_scale_ptr, _M, N, K, _sam, stride_ask, _sbn, stride_bsk, stride_bias, \
        stride_om, stride_osm, eps, own_steps, _rows, _E, _sbe, stride_biase = params
    row, end, pid_n, e = place
    bias_ptr = bias_ptr + e * stride_biase
    a_bufs, b_bufs, ready, empty, stagger_bar = ring
    c_smem, acc_ready, acc_free = epi_smem
    bias_smem, bias_ready, bias_free = bias_stage
    ROWS: gl.constexpr = zero.shape[0]
    SUB_N: gl.constexpr = zero.shape[1]
    mma: gl.constexpr = zero.type.layout
    TMA_STORE: gl.constexpr = TMA_OUT and LIVE == BLOCK_N // SUB_N
    UNIFORM_BS: gl.constexpr = SCALE_BN % SUB_N == 0
    EPI: gl.constexpr = c_smem.type.shape[0] // 2  # output buffers per warpgroup (with TMA_OUT)
    # Column sub-tiles per re-quantization group (1 where a group lies within one, or without one).
    SPAN: gl.constexpr = OUT_GROUP // SUB_N if OUT_GROUP > SUB_N else 1
    NSUB: gl.constexpr = BLOCK_N // SUB_N
    row0 = row + C * ROWS
    a_s_ptrs, b_s_ptrs = _scale_ptrs(params, place, zero, C, SCALE_BN, NSUB, LIVE)
    if PRELOAD != "none":
        first = (first[0], first[1][:LIVE])
    accs, it = _mainloop(a_bufs, b_bufs, ready, empty, it, num_kb, a_s_ptrs, b_s_ptrs, stride_ask, stride_bsk, first,
                         zero, C, UNIFORM_BS, PIPELINE, PRELOAD != "none")
    if PRELOAD == "loop":
        # Their latency passes in this tile's epilogue, not before the next tile's first wgmma.
        first = _first_scales(params, nxt, zero, C, SCALE_BN, NSUB)
    if STAGGER and C == 0:
        if t == 0:  # a branch: the arrival's barrier over the warpgroup would cost every tile
            mbarrier.arrive(stagger_bar, count=1)

    if EPI_ROWS:
        for j in gl.static_range(LIVE):
            col0 = pid_n * BLOCK_N + j * SUB_N
            _hand_over(accs[j], c_smem.index(C), acc_free.index(C), acc_ready.index(C), h)
            h += 1
            # This warpgroup's own share, while the epilogue partition runs the rest.
            _staged_rows(c_smem.index(C), 0, own_steps, row0, col0, end, N, bias_ptr, stride_bias, out_ptr,
                         stride_om, out_scale_ptr, stride_osm, eps, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT,
                         GROUP_TAIL, TINY_SCALES, EPI_ROWS)
            _barrier()  # every own row read before the next sub-tile is stored
    else:
        # The register epilogue's bias comes from the producer through shared memory. Loaded by the
        # consumers at the epilogue, each sub-tile's waited for it (at 4096×32768×512 the wide tile with a bias
        # took 1.33 times the plain GEMM's time); loaded at the tile's
        # start and held through the main loop, ptxas spilled it right after each load, and the warps waited
        # for those loads before the tile's first wgmma.
        BIAS_KIND: gl.constexpr = "none" if BIAS == "none" else "fp32"  # as `_stage_bias` stored it
        if BIAS != "none":
            mbarrier.wait(bias_ready.index(t % 2), (t // 2) & 1)
        # Sub-tiles in groups of SPAN: one re-quantization group each where it spans several (on N's last column
        # tile the last group may hold fewer: those within N).
        for g in gl.static_range((LIVE + SPAN - 1) // SPAN):
            col0 = pid_n * BLOCK_N + g * SPAN * SUB_N
            biases = ()
            for j in gl.static_range(g * SPAN, (g + 1) * SPAN if (g + 1) * SPAN <= LIVE else LIVE):
                biases = biases + (_staged_bias(bias_smem, t, j, BIAS, gl.SliceLayout(0, mma)), )
            if SPAN == 1:
                done = (_finished(accs[g], row0, col0, end, N, biases[0], out_scale_ptr, stride_osm, eps, BIAS_KIND,
                                  ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, GROUP_TAIL, TINY_SCALES), )
            else:
                done = _requantized(accs, biases, g, row0, col0, end, N, out_scale_ptr, stride_osm, eps, BIAS_KIND,
                                    ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, GROUP_TAIL, TINY_SCALES)
            for i in gl.static_range(len(done)):
                res, rows, cols, mask = done[i]
                j = g * SPAN + i
                if TMA_STORE:
                    # Stores complete in order, and a whole tile's sub-tiles are a multiple of EPI: with at most
                    # EPI - 1 of them pending, the one that last read this buffer (this tile's or the previous one's)
                    # is done.
                    tma.store_wait(pendings=EPI - 1)
                    buf = c_smem.index(C * EPI + j % EPI)
                    buf.store(res.to(buf.dtype))
                    fence_async_shared()
                    _tma_store(out_desc, [row0, col0 + i * SUB_N], buf)
                else:
                    gl.store(out_ptr + rows[:, None] * stride_om + cols[None, :],
                             res.to(out_ptr.dtype.element_ty), mask=mask)
        if PRELOAD == "stores":
            first = _first_scales(params, nxt, zero, C, SCALE_BN, NSUB)
        if BIAS != "none":
            _barrier()  # every thread's bias reads done before the one arrival
            mbarrier.arrive(bias_free.index(t % 2), count=1)
    return it, h, first


@gluon.jit
def _consume(ring, out_desc, epi_smem, bias_stage, params, C: gl.constexpr, SCALE_BN: gl.constexpr,
             BIAS: gl.constexpr, ACTIVATION: gl.constexpr, OUT: gl.constexpr, OUT_GROUP: gl.constexpr,
             UE8M0_OUT: gl.constexpr, GROUP_TAIL: gl.constexpr, TINY_SCALES: gl.constexpr, BLOCK_N: gl.constexpr,
             GROUP_M: gl.constexpr, PIPELINE: gl.constexpr, TMA_OUT: gl.constexpr, EPI_ROWS: gl.constexpr,
             STAGGER: gl.constexpr, TAIL_NSUB: gl.constexpr, PRELOAD: gl.constexpr, K_POSITIVE: gl.constexpr,
             E_PAD: gl.constexpr):
    """Consumer warpgroup C: rows [C·ROWS, (C+1)·ROWS) of every tile of this program, K block by K
    block from the slot ring (`ring`: a_bufs, b_bufs, ready, empty), in column sub-tiles of SUB_N, then the
    epilogue sub-tile by sub-tile (`epi_smem`: c_smem, acc_ready, acc_free):
    handed over to the epilogue partition (EPI_ROWS > 0: c_smem holds this warpgroup's fp32 sub-tile,
    guarded by its acc_ready / acc_free mbarriers, `_epilogue`), this warpgroup running its first
    own_steps steps itself; else from the MMA's register layout, through shared memory and a TMA store
    (TMA_OUT: out_desc, this warpgroup's EPI buffers in c_smem, taken in turn; the stores of one tile
    run during the next tile's main loop) or with masked stores, with the tile's bias as the producer staged
    it (`bias_stage`: bias_smem, bias_ready, bias_free; `_stage_bias`). `params`: the kernel's pointers,
    sizes, strides, eps and own_steps (`block_scaled_mm_ws_kernel`). STAGGER: consumer 1 starts a main loop behind
    consumer 0 (`block_scaled_mm_ws_kernel`). TAIL_NSUB: N's last column tiles, walked after the others in a loop of
    their own, take only their first TAIL_NSUB sub-tiles (`_tile_work`). PRELOAD ("loop", "stores"; "none"): each
    tile's K block 0 scales are loaded during the tile before (`_tile_work`). K_POSITIVE: as the kernel's. E_PAD:
    grouped (`_place`)."""
    K = params[7]
    a_bufs, b_bufs, _ready, _empty, stagger_bar = ring
    BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    SUB_N: gl.constexpr = b_bufs.type.shape[1]
    ROWS: gl.constexpr = BLOCK_M // 2
    NSUB: gl.constexpr = BLOCK_N // SUB_N
    # One warpgroup, m64nSUB_Nk32 instructions (k is 32 for 8-bit operands), repeated over ROWS.
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, SUB_N, 256 // a_bufs.dtype.primitive_bitwidth])
    zero = gl.zeros([ROWS, SUB_N], gl.int32 if a_bufs.dtype == gl.int8 else gl.float32, mma)

    num_kb = gl.cdiv(K, BLOCK_K)
    if K_POSITIVE:
        # K >= 1 (the spec's checks). Told so, the compiler drops the K loop's zero-trip path, whose own zeroing
        # of the accumulators ran on every tile beside the loop's (`gluon_launch.k_positive`).
        gl.assume(num_kb > 0)
        gl.assume(K != 0)
    if STAGGER and C == 1:
        # Consumer 1 starts a main loop behind consumer 0, which then runs its epilogue beside consumer 1's wgmmas,
        # and consumer 1 its own beside consumer 0's next main loop. (The launch asks for it only where a tile's K
        # blocks fit the ring: else consumer 0 would wait for consumer 1 to release a slot, and it for consumer 0.)
        mbarrier.wait(stagger_bar, 0)
    it = 0
    h = 0  # sub-tiles handed over to the epilogue partition
    t = 0  # this program's tiles so far
    work = (ring, out_desc, epi_smem, bias_stage, params)
    # The producer's walk over this program's tiles (persistent: pid, pid + programs, ...), in step: with
    # TAIL_NSUB, the whole column tiles' loop, then the last column's (`_tile` orders them so). (A branch per
    # tile between the two in one loop made ptxas spill the weight scales' pointers inside the main loop.)
    whole, tiles = _walk(params, BLOCK_M, BLOCK_N, TAIL_NSUB, E_PAD, 4)
    first = 0
    if PRELOAD != "none":
        # The first tile's K block 0 scales (a program past the last tile reads the last tile's, unused).
        first = _first_scales(params, _place(gl.minimum(gl.program_id(0), tiles - 1), params, BLOCK_M, BLOCK_N,
                                             GROUP_M, TAIL_NSUB, E_PAD, 4), zero, C, SCALE_BN, NSUB)
    for tile in range(gl.program_id(0), whole, gl.num_programs(0)):
        place = _place(tile, params, BLOCK_M, BLOCK_N, GROUP_M, TAIL_NSUB, E_PAD, 4)
        nxt = place
        if PRELOAD != "none":
            # This program's next tile (after the last whole column tile, the last column's first; after the last
            # tile, the last again), whose K block 0 scales PRELOAD loads.
            nxt = _place(gl.minimum(tile + gl.num_programs(0), tiles - 1), params, BLOCK_M, BLOCK_N, GROUP_M, TAIL_NSUB,
                         E_PAD, 4)
        it, h, first = _tile_work(work, (it, h, t, num_kb, place, zero, first, nxt), C, SCALE_BN, BIAS, ACTIVATION,
                                  OUT, OUT_GROUP, UE8M0_OUT, GROUP_TAIL, TINY_SCALES, PIPELINE, TMA_OUT, EPI_ROWS,
                                  STAGGER, BLOCK_N, NSUB, PRELOAD)
        t += 1
    if TAIL_NSUB:
        for tile in range(_next_tile(whole), tiles, gl.num_programs(0)):
            place = _place(tile, params, BLOCK_M, BLOCK_N, GROUP_M, TAIL_NSUB, 0, 4)
            nxt = place
            if PRELOAD != "none":
                nxt = _place(gl.minimum(tile + gl.num_programs(0), tiles - 1), params, BLOCK_M, BLOCK_N, GROUP_M,
                             TAIL_NSUB, 0, 4)
            it, h, first = _tile_work(work, (it, h, t, num_kb, place, zero, first, nxt), C, SCALE_BN, BIAS, ACTIVATION,
                                      OUT, OUT_GROUP, UE8M0_OUT, GROUP_TAIL, TINY_SCALES, PIPELINE, TMA_OUT, EPI_ROWS,
                                      STAGGER, BLOCK_N, TAIL_NSUB, PRELOAD)
            t += 1
    if TMA_OUT:
        tma.store_wait(pendings=0)


@gluon.jit
def block_scaled_mm_ws_kernel(
        a_desc, b_desc, out_desc, a_scale_ptr, b_scale_ptr, bias_ptr, out_ptr, out_scale_ptr, rows_ptr, M, N, K,
        stride_asm, stride_ask, stride_bsn, stride_bsk, stride_bias, stride_om, stride_osm, eps, own_steps, E,
        stride_bse, stride_biase, SCALE_BN: gl.constexpr, BIAS: gl.constexpr, ACTIVATION: gl.constexpr, OUT: gl.constexpr,
        OUT_GROUP: gl.constexpr, UE8M0_OUT: gl.constexpr, GROUP_TAIL: gl.constexpr, TINY_SCALES: gl.constexpr,
        BLOCK_N: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, PIPELINE: gl.constexpr,
        TMA_OUT: gl.constexpr, CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, EPI_ROWS: gl.constexpr,
        EPILOGUE_REGS: gl.constexpr, STAGGER: gl.constexpr, TAIL_NSUB: gl.constexpr, PRELOAD: gl.constexpr,
        K_POSITIVE: gl.constexpr, E_PAD: gl.constexpr):
    """a [M, K] @ b [N, K]^T with block scales and a fused epilogue, on sm_90; with E_PAD, the grouped GEMM of
    mixture-of-experts layers (below).

    a_desc / b_desc: Gluon TMA descriptors over a and b (e4m3 or int8, both alike) with blocks
    [BLOCK_M, BLOCK_K] and [SUB_N, BLOCK_K], BLOCK_K the scale block along K, SUB_N a power of two dividing
    BLOCK_N (<= 256): the columns of one wgmma, its partial and one epilogue step. a_scale [M, ceil(K/BLOCK_K)]
    and b_scale [ceil(N/SCALE_BN), ceil(K/BLOCK_K)] fp32 with the given strides; bias [N] of kind BIAS
    ("none", "fp32", "fp16", "bf16"); ACTIVATION as `epilogue.activate`; out [M, N] of kind OUT ("fp32",
    "fp16", "bf16" as int16 bits; or "fp8" as uint8 bits, "int8": codes re-quantized per 1×OUT_GROUP,
    OUT_GROUP dividing SUB_N (or without EPI_ROWS a multiple of it dividing BLOCK_N), with scales
    max(amax, eps) / qmax, rounded up to a power of two when UE8M0_OUT, into out_scale [M, ceil(N/OUT_GROUP)]
    fp32 with row stride stride_osm; GROUP_TAIL: N is not a multiple of OUT_GROUP; TINY_SCALES: a scale may lie
    below `quant.TINY_SCALE`, eps being that small), written through out_desc
    (blocks [BLOCK_M / 2, SUB_N]) when TMA_OUT, else through out_ptr with row stride stride_om. Launched with
    num_warps=4 (the default partition, consumer 0) and a grid of at most one program per SM; STAGES slots in
    the ring; PIPELINE as in the module docstring; CONSUMER_REGS / PRODUCER_REGS / EPILOGUE_REGS the registers
    per thread of the worker partitions; EPI_ROWS > 0 hands the epilogue to a partition of its own (4 warps),
    that many rows a step (`_epilogue`; TMA_OUT must then be off), each consumer keeping its first own_steps
    steps of every sub-tile. With STAGGER consumer 1 starts once consumer 0 has finished its first tile's main loop,
    which only a tile's K blocks that fit the ring (cdiv(K, BLOCK_K) <= STAGES) allow. TAIL_NSUB > 0 (without
    EPI_ROWS): N's last column tile has that many column sub-tiles within N, fewer than BLOCK_N / SUB_N, and only
    they are loaded, multiplied and stored, that tile's in a column of its own walked after the others (`_tile`).
    PRELOAD (column sub-tiles only; "none" without): each tile's K block 0 scales are loaded during the tile before,
    once its main loop is done ("loop") or once its epilogue's stores are issued ("stores"). K_POSITIVE: the compiler
    is told that K is at least 1, as it always is (`gluon_launch.k_positive` says where).

    Grouped (E_PAD > 0, a power of two >= max(E, 32)): a [M, K] holds E experts' rows sorted by expert, expert e's
    rows offsets[e]:offsets[e+1] (rows_ptr: int32 offsets [E + 1] on the device; empty experts allowed), b_desc
    describes the stacked weights [E, N, K] as [E·N, K], b_scale [E, ceil(N/SCALE_BN), ceil(K/BLOCK_K)] and bias
    [E, N] with expert strides stride_bse and stride_biase: each expert's rows get out = a_e @ b[e]^T with its
    scales and bias, the dense tile program on them (`_place` numbers the tiles expert by expert), so bit for bit
    the dense kernel's rows. A tile's rows past its expert read the next expert's (or TMA's zeros past a) and are
    never stored, nor its columns past N, which read the next expert's weight; the output is stored with masks
    (no TMA_OUT: a box would cross into the next expert's rows) and every tile whole (no TAIL_NSUB). Dense:
    rows_ptr unused, E 1, the expert strides 0.
    """
    gl.static_assert(E_PAD == 0 or (not TMA_OUT and TAIL_NSUB == 0), "a grouped GEMM stores with masks, tiles whole")
    gl.static_assert(TAIL_NSUB == 0 or EPI_ROWS == 0, "a tail of skipped sub-tiles needs the register epilogue")
    # The staged epilogue never reaches the loads "stores" places after the register epilogue's stores.
    gl.static_assert(PRELOAD != "stores" or EPI_ROWS == 0, "PRELOAD 'stores' needs the register epilogue")
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    NSUB: gl.constexpr = BLOCK_N // b_desc.block_type.shape[0]
    # Slot s holds B's sub-tiles s·NSUB, ..., s·NSUB + NSUB - 1.
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES * NSUB] + b_desc.block_type.shape, b_desc.layout)
    if EPI_ROWS:
        # Per consumer warpgroup one fp32 sub-tile, swizzled in 8-element units by row: the MMA layout's
        # stores (two columns of eight rows a warp) then spread over the banks.
        c_smem = gl.allocate_shared_memory(gl.float32, [2, a_desc.block_type.shape[0] // 2, b_desc.block_type.shape[0]],
                                           gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    elif TMA_OUT:
        # Per consumer warpgroup EPI buffers of one column sub-tile, used in turn: two where NSUB is even
        # (halving the shared memory of a 256-wide tile's), else one per sub-tile.
        EPI: gl.constexpr = 2 if NSUB % 2 == 0 else NSUB
        c_smem = gl.allocate_shared_memory(out_desc.dtype, [2 * EPI] + out_desc.block_type.shape, out_desc.layout)
    else:
        c_smem = a_bufs  # unused
    # The register epilogue's bias, staged by the producer: two tiles' of BLOCK_N elements in fp32.
    BIAS_SMEM: gl.constexpr = BIAS != "none" and not EPI_ROWS
    if BIAS_SMEM:
        bias_smem = gl.allocate_shared_memory(gl.float32, [2 * NSUB, b_desc.block_type.shape[0]],
                                              gl.SwizzledSharedLayout(1, 1, 1, [0]))
    else:
        bias_smem = a_bufs  # unused
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warpgroup
    if STAGGER:
        # Consumer 0 has finished its first tile's main loop (`_consume`).
        stagger_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout()).index(0)
        mbarrier.init(stagger_bar, count=1)
    else:
        stagger_bar = ready.index(0)  # unused

    # Per consumer warpgroup: its fp32 sub-tile is in c_smem (acc_ready), c_smem is free again (acc_free).
    acc_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    acc_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # Per slot of bias_smem: the producer has filled it (bias_ready), both consumers have read it (bias_free).
    bias_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    bias_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(acc_ready.index(i), count=1)
        mbarrier.init(acc_free.index(i), count=1)
        mbarrier.init(bias_ready.index(i), count=1)
        mbarrier.init(bias_free.index(i), count=2)  # one arrival per consumer warpgroup

    params = (a_scale_ptr, b_scale_ptr, bias_ptr, out_ptr, out_scale_ptr, M, N, K, stride_asm, stride_ask,
              stride_bsn, stride_bsk, stride_bias, stride_om, stride_osm, eps, own_steps, rows_ptr, E, stride_bse,
              stride_biase)
    ring = (a_bufs, b_bufs, ready, empty, stagger_bar)
    epi_smem = (c_smem, acc_ready, acc_free)
    bias_stage = (bias_smem, bias_ready, bias_free)
    # (A tuple of the constexprs would make them tensors: each partition's arguments are spelled out.)
    if EPI_ROWS:
        gl.warp_specialize([
            (_consume, (ring, out_desc, epi_smem, bias_stage, params, 0, SCALE_BN, BIAS, ACTIVATION, OUT, OUT_GROUP,
                        UE8M0_OUT, GROUP_TAIL, TINY_SCALES, BLOCK_N, GROUP_M, PIPELINE, TMA_OUT, EPI_ROWS,
                        STAGGER, TAIL_NSUB, PRELOAD, K_POSITIVE, E_PAD)),
            (_consume, (ring, out_desc, epi_smem, bias_stage, params, 1, SCALE_BN, BIAS, ACTIVATION, OUT, OUT_GROUP,
                        UE8M0_OUT, GROUP_TAIL, TINY_SCALES, BLOCK_N, GROUP_M, PIPELINE, TMA_OUT, EPI_ROWS,
                        STAGGER, TAIL_NSUB, PRELOAD, K_POSITIVE, E_PAD)),
            (_produce, (a_desc, b_desc, ring, bias_stage, params, BLOCK_N, GROUP_M, BIAS, BIAS_SMEM, TAIL_NSUB, E_PAD)),
            (_epilogue, (c_smem, acc_ready, acc_free, params, BIAS, ACTIVATION, OUT, OUT_GROUP, UE8M0_OUT, GROUP_TAIL,
                         TINY_SCALES, BLOCK_N, GROUP_M, EPI_ROWS, E_PAD)),
        ], [4, 1, 4], [CONSUMER_REGS, PRODUCER_REGS, EPILOGUE_REGS])
    else:
        gl.warp_specialize([
            (_consume, (ring, out_desc, epi_smem, bias_stage, params, 0, SCALE_BN, BIAS, ACTIVATION, OUT, OUT_GROUP,
                        UE8M0_OUT, GROUP_TAIL, TINY_SCALES, BLOCK_N, GROUP_M, PIPELINE, TMA_OUT, EPI_ROWS,
                        STAGGER, TAIL_NSUB, PRELOAD, K_POSITIVE, E_PAD)),
            (_consume, (ring, out_desc, epi_smem, bias_stage, params, 1, SCALE_BN, BIAS, ACTIVATION, OUT, OUT_GROUP,
                        UE8M0_OUT, GROUP_TAIL, TINY_SCALES, BLOCK_N, GROUP_M, PIPELINE, TMA_OUT, EPI_ROWS,
                        STAGGER, TAIL_NSUB, PRELOAD, K_POSITIVE, E_PAD)),
            (_produce, (a_desc, b_desc, ring, bias_stage, params, BLOCK_N, GROUP_M, BIAS, BIAS_SMEM, TAIL_NSUB, E_PAD)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
