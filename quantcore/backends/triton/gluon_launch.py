"""The launch of the Gluon GEMM (`kernels/gluon_gemm.py`) on sm_90: scaled_mm and quant_linear of the
`triton[gluon]` variant.

Imports Triton and its Gluon at its top; quantcore imports this module only when that variant is
launched (the registry's constraints say where it can run: `triton/gluon.py`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ...errors import InvalidInputError
from ...runtime.launch import prepared, prepared_quant_linear
from .direct import Launcher
from .gluon import TILE_N
from .kernels.gluon_gemm import block_scaled_mm_ws_kernel
from .kernels.quant import scales_may_be_tiny
from .launch import _KIND, _bias_kind, _gemm_outputs, _kernel_bias, act_quant, flat_rows, fused_linear

_WARPS = 4  # the default partition: consumer warpgroup 0 (the kernel adds a consumer warpgroup and a producer warp)
# Triton 3.6 starts the partitions' warpgroups at an equal share of the 65536 registers (three: 168 a
# thread; four, with the epilogue partition: 128) and gives the default partition (consumer 0) what the
# workers' budgets leave of that.
_PARTITION_REGS = {False: 3 * 168, True: 4 * 128}
_GL_DTYPE = {torch.float8_e4m3fn: gl.float8e4nv, torch.int8: gl.int8, torch.uint8: gl.uint8, torch.int16: gl.int16,
             torch.float16: gl.float16, torch.float32: gl.float32}


@dataclass(frozen=True)
class GluonConfig:
    """One launch of the Gluon GEMM: a BLOCK_M × BLOCK_N tile (each consumer warpgroup BLOCK_M/2 rows),
    loaded, multiplied and promoted in column sub-tiles of `sub_n` (None: block_n; a power of two
    dividing block_n, one TMA box of B, one wgmma and one fp32 partial each, so that a wide tile's
    partials need not be held whole and block_n need not be a power of two); `stages` slots in the TMA
    ring (None: as many as fit, at most 6); `pipeline`: each warpgroup issues a wgmma before it promotes
    the one before, in steps of two K blocks without sub-tiles, of one K block with them (only where
    the weight scale is one per sub-tile: a per-column one in two sets of registers spills); `group_m`
    row tiles per L2 group of the persistent walk; `producer_regs` the producer warp's registers a
    thread (setmaxnreg: a multiple of 8 from 24; None: 40, or 24 beside the epilogue partition), the
    two consumer warpgroups sharing the rest (40: 232 each, 24: 240 each; beside the partition 24: 216);
    `epi_rows`: the epilogue staged through shared memory, that many rows a step (0: in the consumers,
    from the MMA's registers; None: `EPI_ROWS` with an activation, else 0), by a partition of its own
    with `epilogue_regs` registers a thread, each consumer running the first `own_rows` rows of its
    sub-tiles itself meanwhile (None: `own_rows_for` the call); `stagger`: consumer warpgroup 1 starts once
    consumer 0 has finished its first tile's main loop, so that their epilogues do not coincide (where a tile's K
    blocks fit the ring; elsewhere the launch starts them together).
    `DEFAULT` is the first measured configuration; `config_for` picks the wide ones (`WIDE`) where
    a later probe measured them faster."""

    block_m: int = 128
    block_n: int = TILE_N
    stages: int | None = None
    pipeline: bool = True
    sub_n: int | None = None
    group_m: int = 8  # as the tiled kernel's
    producer_regs: int | None = None
    epi_rows: int | None = None
    epilogue_regs: int = 56
    own_rows: int | None = None
    stagger: bool = False

    def __post_init__(self):
        sub = self.sub_n or self.block_n
        # Tensors and TMA boxes have power-of-two sizes, wgmma's N stops at 256.
        if not (8 <= sub <= self.block_n <= 256 and sub & (sub - 1) == 0 and self.block_n % sub == 0):
            raise InvalidInputError(f"GluonConfig: the column sub-tile {sub} (sub_n, else block_n) must be a power "
                                    f"of two from 8 dividing block_n {self.block_n}, at most 256; set sub_n to one")
        rows = self.epi_rows
        if rows and (rows < 8 or rows & (rows - 1) or (self.block_m // 2) % rows):
            raise InvalidInputError(f"GluonConfig: epi_rows must be 0, None or a power of two from 8 dividing a "
                                    f"consumer's {self.block_m // 2} rows, got {rows}")
        if self.own_rows is not None and not (0 <= self.own_rows <= self.block_m // 2
                                              and self.own_rows % (self.epi_rows or EPI_ROWS) == 0):
            raise InvalidInputError(f"GluonConfig: own_rows must be None or a multiple of the epilogue's step "
                                    f"({self.epi_rows or EPI_ROWS} rows) from 0 to a consumer's {self.block_m // 2} "
                                    f"rows, got {self.own_rows}")
        for name, low, high in (("producer_regs", 24, 64), ("epilogue_regs", 24, 128)):
            regs = getattr(self, name)
            if regs is not None and (regs % 8 or not low <= regs <= high):
                raise InvalidInputError(f"GluonConfig: {name} must be a multiple of 8 from {low} to {high}, got {regs}")

    def holds_groups(self, out_group: int | None, staged: bool) -> bool:
        """Whether a re-quantized output's 1×out_group groups (None: no re-quantization) fit this tile's
        epilogue: within one column sub-tile, or, from the MMA's registers (not `staged`), over whole
        sub-tiles of one tile (their amaxes combined: `gluon_gemm._requantized`)."""
        return (out_group is None or self.sub % out_group == 0
                or not staged and out_group % self.sub == 0 and self.block_n % out_group == 0)

    @property
    def sub(self) -> int:
        """The columns of one B box, one wgmma and its fp32 partial."""
        return self.sub_n or self.block_n

    def producer(self, staged: bool) -> int:
        """The producer warp's registers a thread, beside the epilogue partition when `staged`: there 40
        would leave the consumers 208, where their own share of the epilogue spills."""
        return self.producer_regs or (24 if staged else 40)

    def consumer_regs(self, staged: bool) -> int:
        """Registers a thread of consumer warpgroup 1 (a multiple of 8; consumer 0 gets at least as many),
        beside the epilogue partition when `staged`."""
        return (_PARTITION_REGS[staged] - self.producer(staged) - staged * self.epilogue_regs) // 2 // 8 * 8

    def smem_bytes(self, stages: int, block_k: int, out_bytes: int, staged: bool = False, bias: bool = False) -> int:
        """Shared memory: the ring's A and B tiles (8-bit), the epilogue's buffers (staged: one fp32
        sub-tile per consumer warpgroup; else for a TMA store, out_bytes 0 without: per consumer
        warpgroup two sub-tiles where their count is even, else all, and with a `bias` two tiles' of it in
        fp32), 1 KiB of barriers and slack: at most 1 KiB above Triton 3.6's own count."""
        subs = self.block_n // self.sub
        epi = 2 if subs % 2 == 0 else subs
        if staged:
            buffers = self.block_m * self.sub * 4
        else:
            buffers = self.block_m * epi * self.sub * out_bytes + bias * 2 * self.block_n * 4
        return stages * (self.block_m + self.block_n) * block_k + buffers + 1024


# The default tile; the stage count and pipelining follow from shared memory and the weight's scale block.
DEFAULT = GluonConfig()
# Wider tiles read fewer A and B bytes per FLOP. Measured on the H100 at
# M = 4096 and 16384 on the six bench shapes, they beat the default where N is a whole number of them
# (128x192 on N = 2112 by 4-19 %, 128x256 by up to 14 % on the others, never 2 % slower); at smaller
# M their fewer tiles leave SMs idle, so the default stays there.
WIDE = (GluonConfig(block_n=256, sub_n=64, producer_regs=24), GluonConfig(block_n=192, sub_n=64))
WIDE_M_MIN = 4096
# Row tiles per L2 group of a wide tile's walk where K is at most SHORT_K. There the B column strips, read
# from DRAM again for every group of row tiles, are most of the traffic (Nsight Compute at 4096×32768×512
# with groups of 8: 69.4 MB read against cuBLAS's 19.7), and groups of 32 took 0.3-5.5 % less time on the
# six bench shapes of K ≤ 2048 at 4096 and 16384 rows; at longer K, 16 and 32 moved times by under 1 % either
# way and 8 stays.
SHORT_K, SHORT_K_GROUP_M = 2048, 32
# Where the plain GEMM's wide tile cannot hold a re-quantized output's groups (N = 2112: 128×192 would split groups
# of 128), the output takes the wide tile that does at K above SHORT_K, its last column tile's sub-tiles past N skipped
# (`tail_sub_tiles`). Measured on the H100 at N = 2112, µs, 128×128 / 128×256 at
# K = 7168: FP8 136 / 131 at 4096 rows, 269 / 234 at 8192, 538 / 445 at 16384 (INT8 145 / 146, 266 / 257, 530 / 477);
# at K = 2048 128×128 was the faster at every row count. Before the skip, 128×256 was 12-14 % slower than 128×128
# at 4096 rows (it was kept to 8192 rows and more before).
_MAX_STAGES = 6
# Rows of a staged epilogue's step (`GluonConfig.epi_rows`): two per warp. Measured on the H100 over the
# six bench shapes at M = 512 and 4096, time over the plain GEMM with
# registers / 8 / 16 / 32 rows a step: bias + GELU 2.72 / 1.50 / 1.59 / 1.88 (FP8, 4096 rows), bias +
# SiLU 1.49 / 1.33 / 1.30 / 1.45; a re-quantization without an activation 1.22 / 1.28 (with a GELU before
# it 3.11 / 1.87). With the epilogue partition a
# re-quantization without an activation took, staged / in registers, 1.229 / 1.200 and 1.222 / 1.198 in
# FP8, 1.256 / 1.352 and 1.252 / 1.303 in INT8. Since the quantizer divides through one reciprocal per group
# (4096 rows): registers / staged 1.084 / 1.206 in FP8, 1.232 /
# 1.288 in INT8, so only an activation is staged by default.
EPI_ROWS = 8


def own_rows_for(tiles_per_program: int, num_kb: int) -> int:
    """Rows of each consumer's 64 that it runs the staged epilogue on itself (`GluonConfig.own_rows`),
    for a program of `tiles_per_program` tiles of `num_kb` K blocks. The epilogue partition hides its
    rows under the next tile's main loop, one warp per scheduler at ~73 instructions an element for
    bias + GELU: long K blocks hide it all, short ones not, and a
    last tile's epilogue nothing. Measured on the H100, the best share per shape was 0 from 48 K blocks with
    several tiles a program, about half from 12, and 48 below that or at two tiles a program or fewer."""
    if tiles_per_program <= 2 or num_kb < 12:
        return 48
    return 0 if num_kb >= 48 else 32


def config_for(M: int, N: int, K: int, block_n: int, out_group: int | None, staged: bool = False) -> GluonConfig:
    """The configuration for an M×N output over K with weight-scale blocks `block_n` wide and, when the
    output is re-quantized, groups of `out_group`: a wide tile that N fills exactly at large M, where the
    sub-tiles lie within one weight-scale block and a tile holds whole groups (walked in groups of
    SHORT_K_GROUP_M row tiles where K is at most SHORT_K), else the default. Groups wider than a sub-tile take
    the wide tile at every K: measured on the H100, FP8 at 4096 rows 1.112 / 1.057 at K = 512, 1.028 / 1.033 at
    1536, 1.012 / 1.023 at 2048, 1.024 / 1.008 at 16384; at 16384 rows 1.173 / 1.071, 1.052 / 1.033, 1.001 /
    1.016, 1.046 / 1.014; INT8 alike or better (FP8 was kept on the default tile to K = 2048 before, with a
    heavier epilogue). Where the plain GEMM's wide tile cannot hold the groups, a re-quantized output takes the one
    that does at K above SHORT_K, its last column tile's sub-tiles past N skipped. A wide tile where K is at most
    SHORT_K staggers its consumers (`GluonConfig.stagger`; the launch keeps it where a tile's K blocks fit the ring:
    K = 512 of the bench shapes). At 4096×32768×512 on the H100 that took 1.2 % off FP8's plain GEMM, 0.9 % off a
    re-quantized output and 4.6 % off bias + re-quantized, 2.7 % and 3.6 % off INT8's plain and re-quantized, but
    added 2.3 % to its bias + re-quantized; at 16384 rows 0-2.4 % off each. A
    lead of a few K blocks cost up to 1.6 % on the default tile at 512 rows and with the staged epilogue
    (lead_kb_m512.txt, lead_kb_silu.txt). A `staged` epilogue takes the default tile: the epilogue partition's one
    fp32 buffer per consumer holds one column sub-tile, and a wide tile's consumers would wait for it sub-tile after
    sub-tile (2.1x the default tile's time with bias + GELU at 4096×7168×2048 FP8,
    on the H100)."""
    if not staged and M >= WIDE_M_MIN and block_n % 64 == 0:
        fills = [cfg for cfg in WIDE if N % cfg.block_n == 0]
        wide = next((cfg for cfg in fills if cfg.holds_groups(out_group, staged)), None)
        if wide is None and fills and K > SHORT_K:
            wide = next((cfg for cfg in WIDE if cfg.holds_groups(out_group, staged)), None)
        if wide is not None:
            return replace(wide, group_m=SHORT_K_GROUP_M, stagger=True) if K <= SHORT_K else wide
    return DEFAULT


def tail_sub_tiles(config: GluonConfig, N: int, staged: bool) -> int:
    """The column sub-tiles of N's last column tile that lie within N where the kernel skips the rest
    (`TAIL_NSUB`), 0 where none lie past N. The staged epilogue's partition takes every tile whole: 0 there."""
    live = triton.cdiv(N % config.block_n, config.sub)
    return 0 if staged or live == config.block_n // config.sub else live


def preload(config: GluonConfig, requantized: bool, bias: bool, staged: bool, stagger: bool, tail: int) -> str:
    """Where the kernel loads each tile's K block 0 scales during the tile before (`PRELOAD`, column sub-tiles
    only): "loop" once that tile's main loop is done, for a plain output; "stores" once its epilogue's stores are
    issued, for a re-quantized output where neither the stagger (a tile's K blocks fit the ring) nor N's last column
    loop (`tail`, TAIL_NSUB) is on; else "none". Measured on the H100 against the K loop loading every K block's:
    a plain output 0.6 % (FP8) and 1.6-2.0 % (INT8) faster in geometric mean at 4096 and 16384 rows, 2.4-3.0 % at
    K = 512; a re-quantized output 0.1-1.8 % faster at K = 1536-16384 (N of
    4096 or more) with the loads after its stores, from -1.5 to +3 % with
    them after the main loop, and 2-7 % slower at K = 512 or N = 2112 either way; with a bias, slower at
    every shape and either place, by up to 8 %. Where they lose, what grows
    is the code outside the K loop (the peeled K block 0); at K = 512 the loss is mostly instruction fetch
   .
    """
    if staged or bias or config.sub == config.block_n:
        return "none"
    if not requantized:
        return "loop"
    return "none" if stagger or tail else "stores"


def k_positive(config: GluonConfig, requantized: bool, preload: str, tail: int, fp8: bool) -> bool:
    """Whether the kernel tells the compiler that K is at least 1 (`K_POSITIVE`; the spec's checks refuse an empty K).
    On the column sub-tile schedule without PRELOAD, where no K block runs ahead of the K loop, the compiler otherwise
    keeps the loop's zero-trip path, and ptxas zeroes each tile's accumulators on it as well as before the loop: 63
    more instructions a tile in each consumer thread. Told for re-quantized outputs there. Measured on the H100 against
    the kernel without it, time over the plain GEMM at 4096 rows: INT8 bias +
    re-quantized 1.077 → 1.043, re-quantized 1.045 → 1.034; FP8 1.065 → 1.058 and 1.039 → 1.036. Not for FP8 at N =
    2112, where N's last column runs in a loop of its own (`tail`): 0.5-2.4 % slower there.
    Not with a bf16 output: there ptxas spills 556-632 bytes into the K loop instead (Triton 3.6, offline). Not with
    PRELOAD, where the accumulators are zeroed once already: a plain output 2.6-4.0 % slower in geometric mean beside
    cuBLAS."""
    return (requantized and preload == "none" and config.sub < config.block_n and not (fp8 and tail))


def _fitted(cfg: GluonConfig, block_k: int, out_bytes: int, block_n: int, profile, staged: bool,
            bias: bool = False) -> tuple[int, bool]:
    """(stages, pipeline) of `cfg` for this call: its stages, or as many as fit `profile`'s shared memory."""
    limit = getattr(profile, "smem_per_block", 0) or 232448
    stages = cfg.stages or max(s for s in range(2, _MAX_STAGES + 1)
                               if s == 2 or cfg.smem_bytes(s, block_k, out_bytes, staged, bias) <= limit)
    return stages, cfg.pipeline and block_n % cfg.sub == 0


def _aligned(t: torch.Tensor) -> bool:
    """TMA's rules for an 8-bit operand seen as one [rows, K] matrix: a 16-byte aligned base and `flat_rows`."""
    return t.data_ptr() % 16 == 0 and flat_rows(t)


def _staged(t: torch.Tensor, width: int) -> torch.Tensor:
    """A fresh copy of 8-bit `t` [..., R, K] as [rows, width], rows `width` >= K wide, zero past K: TMA-aligned,
    and the zeros add nothing to any K block's dot (TMA fills past K with zeros all the same)."""
    buf = torch.zeros((t.numel() // t.shape[-1], width), dtype=torch.uint8, device=t.device)
    buf[:, : t.shape[-1]].copy_(t.reshape(-1, t.shape[-1]).view(torch.uint8))
    return buf.view(t.dtype)


def _layout(block: list[int], dtype: torch.dtype) -> gl.NVMMASharedLayout:
    """The shared-memory layout of a TMA box of `block` elements of `dtype`; made once per plan, as making
    one costs more host time (~6 µs) than the descriptor that carries it."""
    return gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPE[dtype])


@prepared
def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant, out_group,
              ue8m0_out, eps, profile, config: GluonConfig | None = None):
    """Block-scaled GEMM a @ b^T with a fused epilogue, warp-specialized and persistent (sm_90).

    a [M, K] and b [N, K] fp8_e4m3fn or int8 (same), a_scale [M, ceil(K/Bk)] and
    b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides), bias [N] bf16/fp16/fp32 or None, activation
    None/"gelu"/"gelu_tanh"/"silu" -> out [M, N] out_dtype (bf16/fp16/fp32), or with out_quant
    (fp8_e4m3fn/int8) (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32) re-quantized per
    1×out_group (a power of two dividing the config's sub-tile, or with the epilogue in registers a multiple
    of it dividing its block_n: `GluonConfig.holds_groups`; scales rounded up to powers of two when
    ue8m0_out, floored at eps). block_k (the K tile) a power of two from 32 to 128. `config` picks the
    tile, ring and schedule (`GluonConfig`; None: `config_for` the call).
    """
    return _prepare(a, a_scale, b, b_scale, None, block_n=block_n, block_k=block_k, bias=bias, activation=activation,
                    out_dtype=out_dtype, out_quant=out_quant, out_group=out_group, ue8m0_out=ue8m0_out, eps=eps,
                    profile=profile, config=config)


@prepared
def grouped_mm(a, a_scale, b, b_scale, expert_offsets, *, block_n, block_k, bias, activation, out_dtype, out_quant,
               out_group, ue8m0_out, eps, profile, config: GluonConfig | None = None):
    """Grouped block-scaled GEMM, contiguous layout (prefill), on the warp-specialized kernel: out[r] = a[r] @
    b[e]^T for the rows r of each expert e, each expert's rows bit for bit what `scaled_mm` gives them.

    a [M, K] fp8_e4m3fn/int8, rows sorted by expert; a_scale [M, ceil(K/Bk)] fp32 (any strides); b [E, N, K] (a's
    dtype, K-contiguous), b_scale [E, ceil(N/Bn), ceil(K/Bk)] fp32; expert_offsets int32 [E + 1] on the device,
    non-decreasing (expert e's rows offsets[e]:offsets[e+1]; empty experts allowed, no padding), read by the kernel
    only (no host synchronization); bias [E, N] or None; the rest as `scaled_mm`'s. Returns out [M, N], or (q,
    scale) re-quantized; rows outside offsets[0]:offsets[E] are left unwritten. `config` as `scaled_mm`'s, chosen
    for M rows in all; a tile never crosses into a second expert.
    """
    launch = _prepare(a, a_scale, b, b_scale, expert_offsets, block_n=block_n, block_k=block_k, bias=bias,
                      activation=activation, out_dtype=out_dtype, out_quant=out_quant, out_group=out_group,
                      ue8m0_out=ue8m0_out, eps=eps, profile=profile, config=config)

    def run(a, a_scale, b, b_scale, expert_offsets, bias=None):
        return launch(a, a_scale, b, b_scale, bias, expert_offsets)
    return run


def _prepare(a, a_scale, b, b_scale, offsets, *, block_n, block_k, bias, activation, out_dtype, out_quant, out_group,
             ue8m0_out, eps, profile, config):
    """The prepared `run(a, a_scale, b, b_scale, bias=None, expert_offsets=None)` of `scaled_mm` (offsets None; b
    [N, K]; its run as it is, no frame between) or `grouped_mm` (b [E, N, K], offsets the experts' row boundaries,
    given to each run), as they describe them."""
    op = "scaled_mm" if offsets is None else "grouped_mm"
    M, K = a.shape
    E, N = (1, b.shape[0]) if offsets is None else b.shape[:2]
    config = config or config_for(M, N, K, block_n, None if out_quant is None else out_group, activation is not None)
    if config.epi_rows is not None:
        epi_rows = config.epi_rows
    else:
        epi_rows = EPI_ROWS if activation is not None else 0
    if not config.holds_groups(None if out_quant is None else out_group, bool(epi_rows)):
        raise InvalidInputError(f"triton[gluon] {op}: out_group_size {out_group} must divide the tile's N "
                                f"sub-tile ({config.sub}) or, with the epilogue in registers (epi_rows 0), be a "
                                f"multiple of it dividing block_n ({config.block_n}); use a GluonConfig whose tile "
                                f"holds whole groups, or backend='triton'")
    outputs = _gemm_outputs(M, N, a.device, out_dtype, out_quant, out_group)
    new_out, new_scale = outputs["_out"], outputs.get("_scale")
    if M == 0 or N == 0 or E == 0:
        return lambda a, a_scale, b, b_scale, bias=None, expert_offsets=None: _returned(new_out(),
                                                                                     new_scale and new_scale())
    kind = out_quant or out_dtype
    out_bits = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8}.get(kind, kind)  # bf16, FP8 as bits
    out_bytes = out_bits.itemsize
    # The output is fresh and contiguous: its row stride decides. A staged epilogue stores with masks, and so does
    # the grouped GEMM, whose boxes would cross into the next expert's rows.
    tma_out = (N * out_bytes) % 16 == 0 and not epi_rows and offsets is None
    stages, pipeline = _fitted(config, block_k, out_bytes if tma_out else 0, block_n, profile, bool(epi_rows),
                               bias is not None)
    bm, bn = config.block_m, config.block_n
    row_tiles, col_tiles = triton.cdiv(M, bm), triton.cdiv(N, bn)
    # Grouped: each expert adds at most one partial row tile (and a tile holds a row).
    tiles = col_tiles * (row_tiles if offsets is None else min(row_tiles + E, M))
    programs = min(tiles, profile.sm_count or tiles)
    own_rows = 0 if not epi_rows else config.own_rows if config.own_rows is not None else \
        own_rows_for(triton.cdiv(row_tiles * col_tiles, programs), triton.cdiv(K, block_k)) // epi_rows * epi_rows
    stagger = config.stagger and triton.cdiv(K, block_k) <= stages
    tail = tail_sub_tiles(config, N, bool(epi_rows)) if offsets is None else 0
    preloaded = preload(config, out_quant is not None, bias is not None, bool(epi_rows), stagger, tail)
    boxes = ([bm, block_k], [config.sub, block_k], [bm // 2, config.sub])
    layouts = _layout(boxes[0], a.dtype), _layout(boxes[1], b.dtype), _layout(boxes[2], out_bits)
    # The launcher makes (or keeps) the descriptors of a, b and out, given in their places.
    descriptors = {i: functools.partial(_descriptor, box=box, layout=layout, bits=bits)
                   for i, (box, layout, bits) in enumerate(zip(boxes, layouts, (a.dtype, b.dtype, out_bits)))}
    launch = Launcher(block_scaled_mm_ws_kernel, (programs,), dict(
        SCALE_BN=block_n, BIAS=_bias_kind(bias), ACTIVATION=activation or "none", OUT=_KIND[kind],
        OUT_GROUP=out_group if out_quant is not None else 1, UE8M0_OUT=bool(ue8m0_out),
        GROUP_TAIL=out_quant is not None and N % out_group != 0, TINY_SCALES=scales_may_be_tiny(eps, out_quant),
        BLOCK_N=bn, STAGES=stages, GROUP_M=config.group_m, PIPELINE=pipeline, TMA_OUT=tma_out,
        CONSUMER_REGS=config.consumer_regs(bool(epi_rows)), PRODUCER_REGS=config.producer(bool(epi_rows)),
        EPI_ROWS=epi_rows, EPILOGUE_REGS=config.epilogue_regs, num_warps=_WARPS,
        STAGGER=stagger, TAIL_NSUB=tail, PRELOAD=preloaded,
        K_POSITIVE=k_positive(config, out_quant is not None, preloaded, tail, a.dtype == torch.float8_e4m3fn),
        E_PAD=0 if offsets is None else max(32, triton.next_power_of_2(E)),
        # The promotion is one FMA per element, as the tiled kernel's under Triton 3.6's default (which
        # later versions turn off).
        enable_fp_fusion=True), a.device, descriptors,
        fixed=(M, N, K, a_scale.stride(0), a_scale.stride(1), b_scale.stride(-2), b_scale.stride(-1),
               0 if bias is None else bias.stride(-1), N, triton.cdiv(N, out_group) if out_quant is not None else 0, eps,
               own_rows // max(epi_rows, 1), E, 0 if offsets is None else b_scale.stride(0),
               0 if bias is None or offsets is None else bias.stride(0)))
    # Operands whose base or row stride TMA cannot take (K not a multiple of 16 included), or stacked weights
    # whose experts do not follow one another row after row, are copied into fresh buffers with rows padded to a
    # multiple of 16 bytes.
    width = triton.cdiv(K, 16) * 16
    copy_a, copy_b = not _aligned(a), not _aligned(b)

    def run(a, a_scale, b, b_scale, bias=None, expert_offsets=None):
        out, out_scale = new_out(), new_scale and new_scale()
        a = _staged(a, width) if copy_a else a
        b = _staged(b, width) if copy_b else b
        launch(a, b, out if tma_out else None, a_scale, b_scale,
               out if bias is None else _kernel_bias(bias), out, out if out_scale is None else out_scale,
               out if expert_offsets is None else expert_offsets)
        return _returned(out, out_scale)
    return run


def _descriptor(t: torch.Tensor, box: list[int], layout, bits: torch.dtype) -> TensorDescriptor:
    """The TMA descriptor of `t` (seen as `bits`; stacked experts [E, N, K] as [E·N, K]) in boxes of `box` with
    shared-memory `layout`."""
    t = t.view(bits)
    return TensorDescriptor.from_tensor(t if t.dim() == 2 else t.reshape(-1, t.shape[-1]), box, layout)


def _returned(out, out_scale):
    """scaled_mm's result: out, or (codes, scales) for a re-quantized output."""
    return out if out_scale is None else (out, out_scale)


@prepared
def quant_linear(x, w, w_scale, *, block_n, block_k, bias, activation, out_dtype, ue8m0, eps, profile, lead=None):
    """The Triton backend's act_quant(x) per 1×block_k group into w's format, then the Gluon scaled_mm;
    eagerly, where the table quantizes once beyond the decode GEMM's rows, in one launch of the decode
    kernel with K unsplit, which sums as the Gluon GEMM does, bit for bit (`launch.fused_linear`).

    x [M, K] bf16/fp16/fp32, w [N, K] fp8_e4m3fn/int8, w_scale [ceil(N/Bn), ceil(K/Bk)] fp32, bias [N] or
    None -> out [M, N] out_dtype, or [*lead, N] where `lead` is given (`runtime.launch.prepared`).
    """
    options = dict(block_n=block_n, block_k=block_k, bias=bias, activation=activation, out_dtype=out_dtype,
                   ue8m0=ue8m0, eps=eps, profile=profile, lead=lead)
    return fused_linear(x, w, w_scale, lambda: prepared_quant_linear(act_quant, scaled_mm, x, w, w_scale, **options),
                        mma=_KIND[w.dtype], unsplit_only=True, **options)
