"""Launch functions of the CuPy backend: the seven ops of docs/backend-contract.md on NVRTC-built
kernels (`kernels/*.cu`).

Tensors stay torch tensors: outputs are allocated with torch, kernels receive raw pointers
(`data_ptr()`) and element strides, and run on torch's current stream of the tensor's device. The
architecture compiled for is `profile.compute_capability`, so a simulated profile runs that GPU's code
path on the real one (see `compiler.get_function`).

Constraints beyond the contract (declared as data in `__init__.py`, where the registry checks them):

* compute capability >= 7.5 with NVRTC 13 (CUDA 13 dropped sm_70), >= 7.0 with NVRTC 12 for the
  memory-bound ops; `scaled_mm` needs 7.5 (INT8 m8n8k16 MMA) and runs FP8 on every such GPU: e4m3 MMA
  on sm_89+, an exact fp16 expansion of the e4m3 values with fp32 accumulation below.
* `scaled_mm`: `block_k` a multiple of 32 (any `block_n`); re-quantized output needs `out_group` a
  power of two <= 128.
* fewer than 2^31 scale blocks (quantize) per call.

Alignment is never a constraint: each kernel moves 16 bytes per access when the pointers, the row
strides, the row length and the block width allow it, and narrower vectors (down to one element)
otherwise; the GEMM falls back from cp.async to byte loads when K or a row stride is not a multiple
of 16 bytes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ...errors import UnsupportedError
from .. import splitk
from ..base import composed_quant_linear
from . import compiler

_CTYPE = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16", torch.float16: "__half", torch.int32: "int"}
_QTYPE = {torch.float8_e4m3fn: "qc::Fp8E4M3", torch.int8: "qc::Int8"}
_ACTIVATION = {None: 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}
_OUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3, torch.int8: 4}
_MMA_E4M3, _MMA_S8, _MMA_F16 = 0, 1, 2

_QUANT_THREADS = 256  # kQuantThreads in blockquant.cuh
_CACHE_FLOATS = 64  # register budget per thread for values kept between the amax and quantize passes
_MAX_GRID = 65535


_streams: dict[tuple[int, int], object] = {}


def _launch(fn, grid, block, args, device: torch.device, smem: int = 0) -> None:
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    ptr = torch.cuda.current_stream(index).cuda_stream
    stream = _streams.get((index, ptr))
    if stream is None:  # wrapping torch's stream costs microseconds: once per stream
        stream = _streams[(index, ptr)] = cupy.cuda.ExternalStream(ptr, index)
    with cupy.cuda.Device(index):
        fn(grid, block, args, shared_mem=smem, stream=stream)


def _function(filename: str, expr: str, profile, device: torch.device, smem: int = 0):
    index = device.index if device.index is not None else torch.cuda.current_device()
    return compiler.get_function(filename, expr, profile, index, smem)


def _row_stride(t: torch.Tensor) -> int:
    """Elements between rows; a single row's stride is meaningless, so it counts as contiguous."""
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


def _vector_width(limit: int, counts: tuple[int, ...], tensors: tuple[torch.Tensor, ...]) -> int:
    """The widest power-of-two vector (<= limit elements) that divides every count and keeps every
    tensor's accesses aligned (to the vector's bytes, at most 16)."""
    vec = limit
    while vec > 1:
        if all(c % vec == 0 for c in counts) and all(
            t.data_ptr() % min(16, vec * t.element_size()) == 0 for t in tensors
        ):
            return vec
        vec //= 2
    return 1


def _team(vectors_per_block: int, vec: int) -> tuple[int, int]:
    """(TEAM, CACHE): threads per block (a power of two up to a warp, or the whole 256-thread block
    for blocks of >= 1024 vectors) and how many vectors each thread keeps in registers."""
    if vectors_per_block >= 1024:
        team = _QUANT_THREADS
    else:
        team = min(32, 1 << max(0, vectors_per_block - 1).bit_length())
    cache = min(math.ceil(vectors_per_block / team), max(1, _CACHE_FLOATS // vec))
    return team, cache


def _ptr(t: torch.Tensor | None) -> int:
    """A device pointer argument; 0 stands for an absent optional tensor."""
    return t.data_ptr() if t is not None else 0


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _i64(v: int) -> np.int64:
    return np.int64(v)


def _quantize(kernel_file: str, expr_head: str, src_args: tuple, tail_args: tuple, q: torch.Tensor,
              scale: torch.Tensor, scale_strides: tuple[int, int], block: tuple[int, int], vec: int,
              profile) -> None:
    """Launch a blockquant.cuh kernel: `src_args` describe the input, then q, its row stride, the
    scale and its strides, then `tail_args` (sizes, eps, ue8m0); template args are appended to
    `expr_head` (VEC, TEAM, CACHE)."""
    rows, cols = q.shape
    nblocks = math.ceil(rows / block[0]) * math.ceil(cols / block[1])
    if nblocks >= 2**31:
        raise UnsupportedError(f"cupy quantize: {nblocks} scale blocks, kernels index fewer than 2^31")
    team, cache = _team(block[0] * math.ceil(min(block[1], cols) / vec), vec)
    fn = _function(kernel_file, f"{expr_head}, {vec}, {team}, {cache}>", profile, q.device)
    grid = max(1, min(math.ceil(nblocks / (_QUANT_THREADS // team)), 32 * max(1, profile.sm_count)))
    args = (*src_args, q.data_ptr(), _i64(cols), scale.data_ptr(), _i64(scale_strides[0]),
            _i64(scale_strides[1]), *tail_args)
    _launch(fn, (grid,), (_QUANT_THREADS,), args, q.device)


def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    """Quantize activations per 1 x group_size block along K.

    x [M, K] bf16/fp16/fp32 (row stride arbitrary) -> (q [M, K] qdtype contiguous,
    scale [M, ceil(K/G)] fp32; with `scale_m_major` the transpose view of a contiguous
    [ceil(K/G), M] buffer).
    """
    M, K = x.shape
    kb = math.ceil(K / group_size)
    q = torch.empty(M, K, dtype=qdtype, device=x.device)
    scale_buf = torch.empty((kb, M) if scale_m_major else (M, kb), dtype=torch.float32, device=x.device)
    if M and K:
        ldx = _row_stride(x)
        vec = _vector_width(16 // x.element_size(), (K, ldx, group_size), (x, q))
        _quantize("quant.cu", f"qc::quant_kernel<{_CTYPE[x.dtype]}, {_QTYPE[qdtype]}", (x.data_ptr(), _i64(ldx)),
                  (_i32(M), _i32(K), _i32(1), _i32(group_size), np.float32(eps), _i32(ue8m0)),
                  q, scale_buf, (1, M) if scale_m_major else (kb, 1), (1, group_size), vec, profile)
    return q, scale_buf.t() if scale_m_major else scale_buf


def weight_quant(w, *, qdtype, block_n, block_k, ue8m0, eps, profile):
    """Quantize weights per block_n x block_k block.

    w [N, K] bf16/fp16/fp32 -> (q [N, K] qdtype contiguous, scale [ceil(N/Bn), ceil(K/Bk)] fp32).
    """
    N, K = w.shape
    nb, kb = math.ceil(N / block_n), math.ceil(K / block_k)
    q = torch.empty(N, K, dtype=qdtype, device=w.device)
    scale = torch.empty(nb, kb, dtype=torch.float32, device=w.device)
    if N and K:
        ldw = _row_stride(w)
        vec = _vector_width(16 // w.element_size(), (K, ldw, block_k), (w, q))
        _quantize("quant.cu", f"qc::quant_kernel<{_CTYPE[w.dtype]}, {_QTYPE[qdtype]}", (w.data_ptr(), _i64(ldw)),
                  (_i32(N), _i32(K), _i32(block_n), _i32(block_k), np.float32(eps), _i32(ue8m0)),
                  q, scale, (kb, 1), (block_n, block_k), vec, profile)
    return q, scale


def quantized_gelu(q, scale, *, group_size, approximate, out_qdtype, ue8m0, eps, profile):
    """GELU on quantized activations: dequantize (fp32(q) * scale), GELU in fp32 ("none": erf,
    "tanh": tanh approximation), re-quantize per 1 x group_size.

    q [M, K] fp8/int8, scale [M, ceil(K/G)] fp32 (any strides) -> (q2 [M, K] out_qdtype,
    scale2 [M, ceil(K/G)] fp32), both contiguous.
    """
    M, K = q.shape
    kb = math.ceil(K / group_size)
    q2 = torch.empty(M, K, dtype=out_qdtype, device=q.device)
    scale2 = torch.empty(M, kb, dtype=torch.float32, device=q.device)
    if M and K:
        ldq = _row_stride(q)
        vec = _vector_width(16, (K, ldq, group_size), (q, q2))
        tanh = "true" if approximate == "tanh" else "false"
        _quantize("epilogue.cu", f"qc::quantized_gelu_kernel<{_QTYPE[q.dtype]}, {_QTYPE[out_qdtype]}, {tanh}",
                  (q.data_ptr(), _i64(ldq), scale.data_ptr(), _i64(scale.stride(0)), _i64(scale.stride(1))),
                  (_i32(M), _i32(K), _i32(group_size), np.float32(eps), _i32(ue8m0)),
                  q2, scale2, (kb, 1), (1, group_size), vec, profile)
    return q2, scale2


def _rowwise_grid(rows: int, vectors_per_row: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(grid, block) for the row-wise elementwise kernels: 256 threads, as many along a row as it
    has vectors (a power of two), the rest over rows."""
    bx = min(256, 1 << max(0, vectors_per_row - 1).bit_length())
    by = 256 // bx
    return (math.ceil(vectors_per_row / bx), min(math.ceil(rows / by), _MAX_GRID)), (bx, by)


def _dequantize(q, scale, block: tuple[int, int], out_dtype, profile):
    R, C = q.shape
    out = torch.empty(R, C, dtype=out_dtype, device=q.device)
    if R and C:
        ldq = _row_stride(q)
        vec = _vector_width(16, (C, ldq, block[1]), (q, out))
        fn = _function("quant.cu", f"qc::dequant_kernel<{_QTYPE[q.dtype]}, {_CTYPE[out_dtype]}, {vec}>", profile, q.device)
        grid, threads = _rowwise_grid(R, C // vec)
        args = (q.data_ptr(), _i64(ldq), scale.data_ptr(), _i64(scale.stride(0)), _i64(scale.stride(1)),
                out.data_ptr(), _i64(C), _i32(R), _i32(C), _i32(block[0]), _i32(block[1]))
        _launch(fn, grid, threads, args, q.device)
    return out


def act_dequant(q, scale, *, group_size, out_dtype, profile):
    """x = fp32(q) * scale[m, k // G], rounded to out_dtype.

    q [M, K] fp8/int8, scale [M, ceil(K/G)] fp32 (any strides) -> x [M, K] out_dtype
    (bf16/fp16/fp32) contiguous.
    """
    return _dequantize(q, scale, (1, group_size), out_dtype, profile)


def weight_dequant(q, scale, *, block_n, block_k, out_dtype, profile):
    """w = fp32(q) * scale[n // Bn, k // Bk], rounded to out_dtype.

    q [N, K] fp8/int8, scale [ceil(N/Bn), ceil(K/Bk)] fp32 -> w [N, K] out_dtype contiguous.
    """
    return _dequantize(q, scale, (block_n, block_k), out_dtype, profile)


def dequant_bias(g, scale_a, scale_b, bias, *, out_dtype, profile):
    """out = fp32(g) * scale_a[m] * scale_b[n] + fp32(bias[n]), left to right in fp32.

    g [M, N] bf16/fp16/fp32/int32, scale_a [M] fp32, scale_b [N] fp32 (any strides), bias [N] any
    float dtype or None -> out [M, N] out_dtype contiguous.
    """
    M, N = g.shape
    out = torch.empty(M, N, dtype=out_dtype, device=g.device)
    if M and N:
        ldg = _row_stride(g)
        vec = _vector_width(16 // g.element_size(), (N, ldg), (g, out))
        bias32 = bias.to(torch.float32).contiguous() if bias is not None else None
        fn = _function("epilogue.cu", f"qc::dequant_bias_kernel<{_CTYPE[g.dtype]}, {_CTYPE[out_dtype]}, {vec}>",
                       profile, g.device)
        grid, threads = _rowwise_grid(M, N // vec)
        args = (g.data_ptr(), _i64(ldg), scale_a.data_ptr(), _i64(scale_a.stride(0)), scale_b.data_ptr(),
                _i64(scale_b.stride(0)), _ptr(bias32), out.data_ptr(),
                _i64(N), _i32(M), _i32(N))
        _launch(fn, grid, threads, args, g.device)
    return out


# ---------------------------------------------------------------- GEMM
#
# Schedule. A decode-sized GEMM (M <= 64) is bound by streaming the weight, N x K bytes, at the copy
# bandwidth (H100: ~3.0 TB/s, i.e. ~23 GB/s or ~13 bytes per cycle per SM). Counting:
#
# * Tile: BM = 16, 32 or 64, the smallest that holds all M rows, so that the weight is read once (one
#   row tile); the MMA rows wasted at M = 1 cost issue slots only. BN = 64 (4 warps of 16 columns)
#   rather than 128: twice the N tiles, so half the splits and a quarter of the partial bytes the
#   last split of a tile reads back (splits x M x BN x 4). BN = 128 when a re-quantize group is 128
#   columns wide (a group must sit in one program).
# * Stages of BK = 128 bytes of K (each row request is a whole 128-byte line), 1 + 32 KB / (BN x BK)
#   of them: 32 KB of weight in flight per CTA, two CTAs per SM in shared memory, 64 KB per SM and
#   8 MB over an H100, well above bandwidth x loaded latency (~3 MB at ~1 us).
# * Issue: per 2 KB of weight a warp's main loop executes about 300 instructions (read off the SASS
#   for FP8 on sm_90, where ptxas emulates the e4m3 mma.sync with fp16 HMMA; fewer for INT8), about
#   1.9 of the SM's 4 per cycle at 13 bytes per cycle. Hence loader and scale pointers set up once
#   and K-block bookkeeping by counting, no divisions in the loop.
# * Grid: 2 x SMs programs, one wave. When the N tiles are fewer, K is split into equal ranges of
#   whole K blocks, as many as fill the wave without exceeding it (a partial second wave would leave
#   most of the memory system idle in its tail): 224 to 264 programs on issue 11's split shapes.
# * The partials are summed in the same launch by the last split of each tile to arrive (gemm.cu):
#   no second kernel and no [splits, M, N] round trip.
#
# Larger M uses a 128 x 128 tile of 8 warps with 64-byte stages, one CTA per SM (~240 registers), and
# the same split rule at one program per SM.


class GemmTile(NamedTuple):
    """A gemm.cu configuration: BM x BN tile, WM x WN warps, BK K bytes per stage, and the CTAs per
    SM it is sized for (stage count and split-K grid)."""

    bm: int
    bn: int
    wm: int
    wn: int
    bk: int
    per_sm: int


_LARGE_TILE = GemmTile(128, 128, 2, 4, 64, 1)
_WEIGHT_IN_FLIGHT = 32 * 1024  # bytes of weight each CTA keeps loading (stages ahead of the MMAs)


def gemm_tile(M: int, out_group: int | None = None) -> GemmTile:
    """The tile for M rows: a decode tile holding all M <= 64 rows (BN = 64, or 128 when a
    re-quantize group `out_group` is wider than 64 columns), else the 128 x 128 tile."""
    if M > 64:
        return _LARGE_TILE
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    return GemmTile(bm, 128 if out_group and out_group > 64 else 64, 1, 4, 128, 2)


def gemm_stages(tile: GemmTile, smem_per_block: int) -> tuple[int, int]:
    """(STAGES, dynamic shared bytes): enough stages to keep 32 KB of weight in flight, as many as
    fit `tile.per_sm` CTAs in the profile's shared memory (at least 2); the epilogue reuses the same
    memory for one warp row of fp32 results."""
    stage = (tile.bm + tile.bn) * tile.bk
    wanted = 1 + math.ceil(_WEIGHT_IN_FLIGHT / (tile.bn * tile.bk))
    stages = max(2, min(wanted, (smem_per_block or 48 * 1024) // tile.per_sm // stage))
    return stages, max(stages * stage, (tile.bm // tile.wm) * (tile.bn + 8) * 4)


def gemm_splits(M: int, N: int, K: int, block_k: int, tile: GemmTile, sm_count: int) -> tuple[int, int]:
    """(K blocks per split, splits): split K only when the output tiles are fewer than the resident
    programs (`tile.per_sm` per SM), into as many equal ranges of whole K blocks as fill them."""
    tiles = math.ceil(M / tile.bm) * math.ceil(N / tile.bn)
    kblocks = max(1, math.ceil(K / block_k))
    per_split = math.ceil(kblocks / max(1, min(kblocks, tile.per_sm * sm_count // tiles)))
    return per_split, math.ceil(kblocks / per_split)


def gemm_kernel_name(kind: int, tile: GemmTile, stages: int, aligned: bool) -> str:
    """The gemm.cu template instantiation for one configuration."""
    bm, bn, wm, wn, bk, _ = tile
    return f"qc::gemm_kernel<{kind}, {bm}, {bn}, {wm}, {wn}, {bk}, {stages}, {'true' if aligned else 'false'}>"


def mma_kind(qdtype: torch.dtype, profile) -> int:
    """Tensor-core path: INT8 MMA, e4m3 MMA (sm_89+), or FP8 through exact fp16 (older GPUs)."""
    if qdtype == torch.int8:
        return _MMA_S8
    return _MMA_E4M3 if tuple(profile.compute_capability) >= (8, 9) else _MMA_F16


def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant,
              out_group, ue8m0_out, eps, profile):
    """Block-scaled GEMM a @ b.T with the contract's epilogues, in one launch (split-K included).

    a [M, K] fp8/int8, a_scale [M, ceil(K/Bk)] fp32 (any strides), b [N, K] same dtype,
    b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides), bias [N] float or None, activation
    None/"gelu"/"gelu_tanh"/"silu". Returns out [M, N] out_dtype (bf16/fp16/fp32), or with
    `out_quant` (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32). The registry guarantees
    block_k % 32 == 0 and, when re-quantizing, out_group a power of two <= 128. When K is split,
    the partials are summed in split order (docs/numerics.md), so results are bit-for-bit the same
    from run to run on one device.
    """
    M, K = a.shape
    N = b.shape[0]
    dev = a.device
    if out_quant is None:
        out, out_scale = torch.empty(M, N, dtype=out_dtype, device=dev), None
    else:
        out = torch.empty(M, N, dtype=out_quant, device=dev)
        out_scale = torch.empty(M, math.ceil(N / out_group), dtype=torch.float32, device=dev)
    if M == 0 or N == 0:
        return out if out_scale is None else (out, out_scale)

    tile = gemm_tile(M, out_group if out_quant is not None else None)
    stages, smem = gemm_stages(tile, profile.smem_per_block)
    lda, ldb = _row_stride(a), _row_stride(b)
    aligned = all(v % 16 == 0 for v in (K, lda, ldb, a.data_ptr(), b.data_ptr()))
    kind = mma_kind(a.dtype, profile)
    kb_per_split, splits = gemm_splits(M, N, K, block_k, tile, max(1, profile.sm_count))
    tiles = math.ceil(M / tile.bm) * math.ceil(N / tile.bn)
    pair = splitk.buffers(dev, tiles * splits * tile.bm * tile.bn, tiles) if splits > 1 else None
    if pair is None:  # unsplit, or the buffers cannot grow now (a stream being captured)
        kb_per_split, splits = kb_per_split * splits, 1
    ws, counters = pair or (None, None)
    grid = (math.ceil(M / tile.bm), math.ceil(N / tile.bn), splits)
    bias32 = bias.to(torch.float32).contiguous() if bias is not None else None

    fn = _function("gemm.cu", gemm_kernel_name(kind, tile, stages, aligned), profile, dev, smem)
    args = (a.data_ptr(), _i64(lda), a_scale.data_ptr(), _i64(a_scale.stride(0)), _i64(a_scale.stride(1)),
            b.data_ptr(), _i64(ldb), b_scale.data_ptr(), _i64(b_scale.stride(0)), _i64(b_scale.stride(1)),
            _ptr(bias32), out.data_ptr(), _i64(N), _ptr(out_scale),
            _i64(out_scale.stride(0) if out_scale is not None else 0), _i64(1), _ptr(ws), _ptr(counters),
            _i32(M), _i32(N), _i32(K), _i32(block_n), _i32(block_k), _i32(kb_per_split * block_k),
            _i32(_ACTIVATION[activation]), _i32(_OUT_KIND[out.dtype]), _i32(out_group or 1),
            _i32(bool(ue8m0_out)), np.float32(eps))
    _launch(fn, grid, (tile.wm * tile.wn * 32,), args, dev, smem)
    return out if out_scale is None else (out, out_scale)


# Two launches: the GEMM reads the activation through cp.async as 8-bit codes, quantized beforehand.
quant_linear = composed_quant_linear(act_quant, scaled_mm)
