"""Launch configurations of the Triton kernels, as data.

`configs/<arch>.json` (e.g. `sm_90.json`) describes one architecture; `default.json` every other
device, the CPU interpreter included. A file holds:

- `"gemm"`: rules `{"mma", "m_max", "n_max", "k_max", "tma", "configs": [...]}`, tried in order;
  `mma` ("fp8", "int8", "fp16" for FP8 decoded to fp16 in the kernel, "fp16_predecoded" for FP8
  decoded to fp16 buffers before it) and the bounds may be null (any). The
  first rule that matches the call's MMA kind and holds M, N and K gives the candidate tiles
  `[BLOCK_M, BLOCK_N, num_warps, num_stages]`, `[..., k_step]` (K blocks multiplied per loop
  iteration, 1 or 2) or `[..., k_step, block_ks]` (the K loaded per pipeline stage, a divisor of the
  scale block that the K loop steps by, chaining each block's MMAs: `GemmConfig.step_k`), best first;
  `"tma": true` loads them through TMA descriptors where the device (sm_90+) and the operands'
  alignment allow. BLOCK_K is always the scale block along K. `"split": {"waves", "min_kb_per_split"}`
  splits K over a second grid axis where the first candidate's output tiles alone leave SMs idle: into
  about `waves` programs per SM, each taking at least `min_kb_per_split` K blocks (a multiple of the
  candidate's k_step, so that no split reads its neighbour's first block as a phantom one); every
  candidate of the rule splits alike, so the choice among them never changes the sums.
  Candidates whose estimated shared memory exceeds `profile.smem_per_block` are dropped. The
  first survivor is used, or, with `QUANTCORE_TRITON_AUTOTUNE=1`, the fastest survivor measured on
  the first call of each (device, M bucket, N, K, variant).
- `"decode"`: the GEMM at decode sizes, M <= `m_max` (kernels/decode.py; `mma_m_max` {mma kind: bound}
  overrides it per MMA kind), and quant_linear fused into
  one launch (the activation quantized in the GEMM's prologue) where a `"fused"` rule `{"m_max",
  "k_max", "nk_max", "quantize"}` holds M, K and N·K (the first that does applies). `"quantize": "program"` (the
  default): every program quantizes its K range of the activation again, work that grows with M and
  (through the programs' K ranges) with K, so past a few rows act_quant + the decode GEMM take less
  GPU time; `"once"`: the programs quantize it once between them into a workspace and wait for it
  (kernels/quantize_once.py), at 1.08-1.24x the two launches' GPU time on the H100 but one launch's
  host time less, so quant_linear takes it outside graph captures only (launch.fused_linear), and
  not for weights whose GPU time exceeds the launch's host time (`nk_max`). A "once" rule past
  `m_max` runs the decode kernel with K unsplit, summing as the tiled and Gluon GEMMs that scaled_mm
  runs there (bit for bit); its rows need a `"rules"` entry for the tile, whose split is unused. Rules
  `{"mma", "m_max", "n_min", "n_max", "k_max", "config": [BLOCK_N, num_warps, num_stages], "waves",
  "min_kb_per_split"}`,
  the first match applies (a large `min_kb_per_split` keeps K whole: no split-K reduction where
  the N tiles alone fill the GPU). K is split so that about `waves` programs per SM stream the weight, each
  taking at least `min_kb_per_split` K blocks; stages are cut until the pipeline fits shared memory.
- `"predecode"`: `{"m_min", "max_bytes"}` or absent: the tiled GEMM on FP8 data without FP8 MMA reads
  both operands decoded to fp16 once per call from `m_min` rows, where the buffers ((M + N)·K·2
  bytes) take at most `max_bytes` (`predecode`).
- `"blocks"`: how much work one program of the memory-bound kernels gets (`elems_per_program`),
  its warps (at most `num_warps`, at least `elems_per_thread` elements each) and how many programs
  per SM to keep at least (`min_waves`); optionally `row_elems_per_thread`, the same floor for the kernels
  that hold a whole row a program (`row_warps`).

This module does not import Triton: the registry may read it to describe what the backend does.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ...registry.impl import on_reset

AUTOTUNE_ENV = "QUANTCORE_TRITON_AUTOTUNE"
_DIR = Path(__file__).with_name("configs")


@dataclass(frozen=True)
class GemmConfig:
    """One GEMM tiling: BLOCK_M × BLOCK_N output tile, warps, software-pipeline stages, K blocks
    per loop iteration, the K of a pipeline stage (0: a whole scale block), whether tiles come
    through TMA descriptors (where the call allows), and K split `split_k` ways of `kb_per_split`
    K blocks each."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    k_step: int = 1
    block_ks: int = 0
    tma: bool = False
    split_k: int = 1
    kb_per_split: int = 0  # K blocks per split (0: K whole)

    def step_k(self, block_k: int, tma: bool) -> int:
        """The K the kernel's loop advances per stage for scale blocks of `block_k`: `block_ks` where it
        divides block_k and the tiles come through pointers one K block per iteration (k_step 1, no
        TMA), else the whole block."""
        ks = self.block_ks
        return ks if ks and ks < block_k and block_k % ks == 0 and self.k_step == 1 and not tma else block_k

    def smem_bytes(self, block_k: int, mma: str) -> int:
        """Shared memory the kernel needs, estimated from the tiles: k_step A and B tiles per pipeline
        stage (8-bit; fp16 when predecoded) plus 1 KiB of barriers (FP8 decoded in the kernel adds its
        decoded fp16 tiles, see `decoded_bytes`), or the epilogue's fp32 tile shuffle if larger (it
        reuses the pipeline's buffers). Checked against Triton 3.6's own count for sm_80/sm_90 on every
        path: never below it by more than 1 KiB, at most one stage (and the 1 KiB) above it."""
        element = 2 if mma == "fp16_predecoded" else 1
        step = self.step_k(block_k, self.tma)
        staged = self.num_stages * self.k_step * (self.block_m + self.block_n) * step * element
        decoded = decoded_bytes(mma, self.k_step * (self.block_m + self.block_n), step)
        return max(staged + decoded + 1024, 4 * self.block_m * self.block_n)


@dataclass(frozen=True)
class DecodeConfig:
    """One decode GEMM launch: all M rows (padded to BLOCK_M >= 16) × BLOCK_N weight rows per program,
    warps and pipeline stages, and K split `split_k` ways, `kb_per_split` K blocks each."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    split_k: int
    kb_per_split: int

    def smem_bytes(self, block_k: int, mma: str) -> int:
        """Shared memory estimate: per stage a weight tile and an activation tile, counted at 4 bytes an
        element (a float activation quantized in the prologue is staged as it comes), plus FP8's
        decoded fp16 tiles (`decoded_bytes`) and 1 KiB."""
        staged = self.num_stages * (self.block_n + 4 * self.block_m) * block_k
        return staged + decoded_bytes(mma, self.block_n + self.block_m, block_k) + 1024


@dataclass(frozen=True)
class BlockTiling:
    """Program shape of the block quantize/dequantize kernels: RB×CB scale blocks of
    BR_PAD×BC_PAD (padded) elements each, the launch grid (row programs, column programs), and
    whether every program holds whole, unpadded blocks inside the tensor (no masks needed)."""

    rb: int
    cb: int
    br_pad: int
    bc_pad: int
    num_warps: int
    grid: tuple[int, int]
    even: bool


def decoded_bytes(mma: str, rows: int, block_k: int) -> int:
    """Shared memory for `rows` rows of one K block decoded from FP8 to fp16 ("fp16" MMA): the kernels
    decode each tile once and stage it there for the MMA (kernels/fp8.py), beside its 8-bit copy."""
    return 2 * rows * block_k if mma == "fp16" else 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _table(arch: str) -> dict:
    path = _DIR / f"{arch}.json"
    return json.loads((path if path.exists() else _DIR / "default.json").read_text())


def _arch(profile) -> str:
    cc = getattr(profile, "compute_capability", None)
    return f"sm_{cc[0]}{cc[1]}" if cc else "default"


def _within(bound: int | None, value: int) -> bool:
    return bound is None or value <= bound


@functools.lru_cache(maxsize=4096)  # on every launch's path: rule matching costs microseconds
def gemm_candidates(profile, M: int, N: int, K: int, *, mma: str, block_k: int,
                    min_block_n: int) -> tuple[GemmConfig, ...]:
    """Tile candidates for an M×N×K GEMM on `profile`, best first, all fitting its shared memory.

    `min_block_n` raises BLOCK_N where a fused re-quantization needs whole groups in a tile.
    Never empty: when nothing fits, the smallest candidate with its stages cut to fit (or to 1).
    """
    rules = _table(_arch(profile))["gemm"]
    rule = next(r for r in rules if r.get("mma") in (None, mma) and _within(r.get("m_max"), M)
                and _within(r.get("n_max"), N) and _within(r.get("k_max"), K))
    # TMA delivers typed e4m3 tiles, while FP8 decoded in the kernel ("fp16") starts from their bits.
    tma = rule.get("tma", False) and mma != "fp16"
    configs = []
    for bm, bn, warps, stages, *steps in rule["configs"]:
        cfg = GemmConfig(bm, max(bn, min_block_n), warps, stages, *steps, tma=tma)
        if cfg not in configs:
            configs.append(cfg)
    if "split" in rule:
        first = configs[0]
        split, per = _split(profile, _cdiv(M, first.block_m) * _cdiv(N, first.block_n), _cdiv(K, block_k),
                            rule["split"]["waves"], rule["split"]["min_kb_per_split"], max(c.k_step for c in configs))
        configs = [replace(c, split_k=split, kb_per_split=per) for c in configs]
    limit = getattr(profile, "smem_per_block", 0) or 0
    if not limit:
        return tuple(configs)
    fitting = tuple(c for c in configs if c.smem_bytes(block_k, mma) <= limit)
    if fitting:
        return fitting
    smallest = min(configs, key=lambda c: c.smem_bytes(block_k, mma))
    while smallest.num_stages > 1 and smallest.smem_bytes(block_k, mma) > limit:
        smallest = replace(smallest, num_stages=smallest.num_stages - 1)
    return (smallest,)


def _split(profile, tiles: int, kbs: int, waves: float, min_kb: int, step: int = 1) -> tuple[int, int]:
    """(splits, K blocks per split) of K's `kbs` blocks so that `tiles` output tiles make about `waves`
    programs per SM of `profile`, each split at least `min_kb` blocks, a multiple of `step`, and
    none empty; (1, kbs) where the tiles fill the GPU alone."""
    wanted = waves * (getattr(profile, "sm_count", 0) or 0)
    split = max(1, min(round(wanted / tiles), kbs // max(min_kb, 1)))
    per = _cdiv(_cdiv(kbs, split), step) * step
    return _cdiv(kbs, per), per


def predecode(profile, M: int, N: int, K: int) -> bool:
    """Whether the tiled GEMM on FP8 data without FP8 MMA reads a and b decoded to fp16 once per call
    (two buffers, (M + N)·K·2 bytes) instead of decoding each tile in the kernel, which decodes every
    operand tile again for each output tile that reads it: ceil(N/BLOCK_N) times for a, ceil(M/BLOCK_M)
    for b. Once M is large the decoding, not the MMA, bounds the in-kernel path."""
    rule = _table(_arch(profile)).get("predecode")
    return bool(rule) and M >= rule["m_min"] and (M + N) * K * 2 <= rule["max_bytes"]


def decode_m_max(profile, mma: str) -> int:
    """The largest M the decode GEMM serves on `profile` for MMA kind `mma`."""
    decode = _table(_arch(profile))["decode"]
    return decode.get("mma_m_max", {}).get(mma, decode["m_max"])


def fused(profile, M: int, N: int, K: int) -> str | None:
    """How quant_linear of M rows over an N×K weight quantizes its activation inside the decode GEMM
    on `profile`, the first `"fused"` rule holding M, K and N·K says: "program" (each program its own
    K range) or "once" (once per launch, shared through a workspace); None: act_quant + the GEMM, two
    launches."""
    rule = next((r for r in _table(_arch(profile))["decode"]["fused"]
                 if _within(r["m_max"], M) and _within(r.get("k_max"), K) and _within(r.get("nk_max"), N * K)), None)
    return None if rule is None else rule.get("quantize", "program")


@functools.lru_cache(maxsize=4096)
def decode_config(profile, M: int, N: int, K: int, *, mma: str, block_k: int, min_block_n: int) -> DecodeConfig:
    """The decode GEMM's launch for M×N×K on `profile` (M <= `decode_m_max` for `mma`). It depends on the shape,
    the MMA kind and the output's needs only, never on where the activation comes from, so that the
    fused quantized linear and act_quant + scaled_mm run the same arithmetic."""
    rules = _table(_arch(profile))["decode"]["rules"]
    rule = next(r for r in rules if r.get("mma") in (None, mma) and _within(r.get("m_max"), M)
                and r.get("n_min", 0) <= N and _within(r.get("n_max"), N) and _within(r.get("k_max"), K))
    block_n, warps, stages = rule["config"]
    block_n = max(block_n, _next_pow2(min_block_n))
    block_m = max(16, _next_pow2(M))
    cfg = DecodeConfig(block_m, block_n, warps, stages,
                       *_split(profile, _cdiv(N, block_n), _cdiv(K, block_k), rule["waves"], rule["min_kb_per_split"]))
    limit = getattr(profile, "smem_per_block", 0) or 0
    while limit and cfg.num_stages > 1 and cfg.smem_bytes(block_k, mma) > limit:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def unsplit(cfg):
    """The same launch (a DecodeConfig or a GemmConfig) with K unsplit (no workspace needed)."""
    return replace(cfg, split_k=1, kb_per_split=0 if isinstance(cfg, GemmConfig) else cfg.split_k * cfg.kb_per_split)


def split_as(cfg: DecodeConfig, gemm: GemmConfig | None) -> DecodeConfig:
    """The decode launch `cfg` with K split as the tiled GEMM `gemm` splits it (None: K whole): the same
    K blocks per split, summed in the same order, so that the two give the same bits."""
    if gemm is None or gemm.split_k == 1:
        return unsplit(cfg)
    return replace(cfg, split_k=gemm.split_k, kb_per_split=gemm.kb_per_split)


_tuned: dict[tuple, GemmConfig] = {}


def gemm_config(profile, M: int, N: int, K: int, *, mma: str, block_k: int, min_block_n: int,
                variant: tuple, bench: Callable[[GemmConfig], float]) -> GemmConfig:
    """The tile to launch: the first candidate, or with QUANTCORE_TRITON_AUTOTUNE=1 the one with
    the least `bench(config)` time, measured once per (device, M bucket, N, K, variant)."""
    candidates = gemm_candidates(profile, M, N, K, mma=mma, block_k=block_k,
                                 min_block_n=min_block_n)
    if os.environ.get(AUTOTUNE_ENV) != "1" or len(candidates) == 1:
        return candidates[0]
    key = (getattr(profile, "name", None), _arch(profile), _next_pow2(M), N, K, block_k,
           min_block_n, mma, variant)
    if key not in _tuned:
        _tuned[key] = min(candidates, key=bench)
    return _tuned[key]


@functools.lru_cache(maxsize=4096)
def block_tiling(R: int, C: int, br: int, bc: int, profile) -> BlockTiling:
    """Program shape for quantizing/dequantizing an R×C tensor in br×bc blocks: whole blocks per
    program up to `elems_per_program` elements, first along C (contiguous) as many as divide the
    block count evenly (no half-masked tail program), then rows of blocks; then halved until the
    grid has `min_waves` programs per SM where the tensor is large enough."""
    params = _table(_arch(profile))["blocks"]
    br_pad, bc_pad = _next_pow2(br), _next_pow2(bc)
    row_blocks, col_blocks = _cdiv(R, br), _cdiv(C, bc)
    budget = max(1, params["elems_per_program"] // (br_pad * bc_pad))
    cb = min(col_blocks & -col_blocks, budget)
    rb = min(_next_pow2(row_blocks), max(1, budget // cb))
    min_programs = params["min_waves"] * (getattr(profile, "sm_count", 0) or 0)
    while _cdiv(row_blocks, rb) * _cdiv(col_blocks, cb) < min_programs and rb * cb > 1:
        if rb > 1:
            rb //= 2
        else:
            cb //= 2
    even = (R % br == 0 and C % bc == 0 and (br, bc) == (br_pad, bc_pad)
            and row_blocks % rb == 0 and col_blocks % cb == 0)
    return BlockTiling(rb, cb, br_pad, bc_pad, _warps(rb * cb * br_pad * bc_pad, params),
                       (_cdiv(row_blocks, rb), _cdiv(col_blocks, cb)), even)


@functools.lru_cache(maxsize=4096)
def tile_2d(M: int, N: int, profile) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of an elementwise M×N kernel: rows of up to 256 contiguous
    elements, `elems_per_program` per program, fewer rows while the grid is under `min_waves`."""
    params = _table(_arch(profile))["blocks"]
    block_n = min(_next_pow2(N), 256)
    block_m = min(_next_pow2(M), max(1, params["elems_per_program"] // block_n))
    min_programs = params["min_waves"] * (getattr(profile, "sm_count", 0) or 0)
    while block_m > 1 and _cdiv(M, block_m) * _cdiv(N, block_n) < min_programs:
        block_m //= 2
    return block_m, block_n, _warps(block_m * block_n, params)


def row_warps(row_elems: int, profile) -> int:
    """num_warps of a kernel holding one whole row of `row_elems` (padded) elements per program (the fused
    RMSNorm): the block kernels' rule with at least `row_elems_per_thread` elements per thread where the table
    sets it. A row program waits for its whole row before it reduces and stores, so rows in flight, not warps
    per row, keep the memory busy: on the H100, 16384 rows of 7168, 8 warps moved 0.85 of the copy rate
    against 0.75 with 16, and 4096-wide rows 0.89 with 4 warps against 0.84 with 8, the same bits."""
    params = _table(_arch(profile))["blocks"]
    return _warps(row_elems, {**params, "elems_per_thread": params.get("row_elems_per_thread",
                                                                         params["elems_per_thread"])})


def _warps(tile_elems: int, params: dict) -> int:
    # At least `elems_per_thread` elements per thread keeps several vector loads in flight each.
    return max(1, min(params["num_warps"], tile_elems // (32 * params["elems_per_thread"])))


@on_reset
def _forget() -> None:
    """Forget the tuned GEMM configurations and the derived tile choices (`registry.reset()`): after a
    change of tables, environment or a simulated profile, they are derived afresh."""
    _tuned.clear()
    for cached in (_table, gemm_candidates, decode_config, block_tiling, tile_2d):
        cached.cache_clear()
