"""Launch functions of the CuPy backend: the ops of docs/backend-contract.md on NVRTC-built kernels
(`kernels/*.cu`).

Tensors stay torch tensors: outputs are allocated with torch, kernels receive raw pointers
(`data_ptr()`) and element strides, and run on torch's current stream of the tensor's device. The
architecture compiled for is `profile.compute_capability`, so a simulated profile runs that GPU's code
path on the real one (see `compiler.get_function`). The GEMM's tensor-core path is the `mma` option
of the implementation the registry chose (`__init__.py`), never re-derived here.

Every function is `prepared` (`runtime.launch.prepared`): its body runs once per kept plan and computes what
depends only on shapes, strides, dtypes, device, options and the inputs' 16-byte alignment (tiles,
stages, splits, vector widths, grids, the compiled kernel and its constant arguments, packed in a
`launcher.Launcher`); the `run` it returns allocates the outputs, reads the tensors' addresses and
launches once (`quant_linear` outside its one-launch bounds, or while a graph is captured: twice).

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
of 16 bytes. Outputs are fresh allocations, which torch aligns to far more than 16 bytes.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import torch

from ...errors import UnsupportedError
from ...runtime import workspace
from ...runtime.launch import allocator, by_address, compose, eagerly, prepared, prepared_quant_linear, transposed
from . import compiler
from .launcher import POINTER, Launcher, f32, i32, i64

_CTYPE = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16", torch.float16: "__half", torch.int32: "int"}
_QTYPE = {torch.float8_e4m3fn: "qc::Fp8E4M3", torch.int8: "qc::Int8"}
_ACTIVATION = {None: 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}
_OUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3, torch.int8: 4}
_BIAS_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # gemm.cu's BiasKind: read as they are
MMA_KIND = {"fp8": 0, "int8": 1, "fp16": 2}  # gemm.cu's MmaKind: e4m3, s8, e4m3 expanded to fp16
_MMA_READS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8, "fp16": torch.float8_e4m3fn}
_A_TYPE = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}

_QUANT_THREADS = 256  # kQuantThreads in blockquant.cuh
_CACHE_FLOATS = 64  # register budget per thread for values kept between the amax and quantize passes
_MAX_GRID = 65535


def _nothing(*addresses: int) -> None:
    """The launch of an empty output."""


def _kernel(filename: str, expr: str, profile, device: torch.device, grid: tuple[int, ...],
            block: tuple[int, ...], args: tuple, smem: int = 0) -> Launcher:
    """The launcher of template instantiation `expr` of kernels/`filename`, built for `profile` and
    loaded on `device`, with its grid, block, shared memory and parameters (`launcher.POINTER` for the
    addresses each call passes)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    fn = compiler.get_function(filename, expr, profile, index, smem)
    return Launcher(fn, grid, block, args, index, smem)


def _row_stride(t: torch.Tensor) -> int:
    """Elements between rows; a single row's stride is meaningless, so it counts as contiguous."""
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


def _vector_width(limit: int, counts: tuple[int, ...], tensors: tuple[torch.Tensor, ...]) -> int:
    """The widest power-of-two vector (<= limit elements) that divides every count and keeps every
    tensor's accesses aligned (to the vector's bytes, at most 16). Fresh outputs need no check."""
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


def _address(t: torch.Tensor | None) -> int:
    """A device pointer argument; 0 stands for an absent optional tensor."""
    return 0 if t is None else t.data_ptr()


def _native_bias(bias: torch.Tensor | None) -> bool:
    """Whether the kernels read `bias` as it is (absent, or fp32/bf16/fp16 at any stride); otherwise each
    call converts it (`_converted`), one more launch: with a bf16 bias converted so, dequant_bias at 1 row
    took 24.1 µs a call on the H100 host against 13.4 without a bias."""
    return bias is None or bias.dtype in _BIAS_KIND


def _bias_name(bias: torch.Tensor | None) -> str | None:
    """The argument name of a bias laid out as `bias` in a generated run (`_run`): None when absent."""
    return None if bias is None else "bias"


def _run(params: str, outputs: dict[str, Callable[[], torch.Tensor]], launch: Callable[..., None],
         addresses: tuple[str | None, ...], bias: torch.Tensor | None, result: str) -> Callable[..., Any]:
    """A prepared run compiled from source (`runtime.launch.compose`): `def run({params})` allocating `outputs`,
    converting its argument `bias` first where the kernels cannot read one laid out as `bias`
    (`_converted`), launching with the addresses of the tensors named in `addresses` (None: 0, an absent
    one) and returning `result`. Written as a closure it asked per call which tensors were absent and
    whether to convert."""
    convert = "" if _native_bias(bias) else "    bias = _converted(bias)\n"
    given = ", ".join("0" if a is None else f"{a}.data_ptr()" for a in addresses)
    # A converted bias is a tensor made per call: the native path takes none.
    native = getattr(launch, "native", None) if not convert else None
    return compose(params, outputs, f"{convert}    _launch({given})\n", {"_launch": launch, "_converted": _converted},
                   result, None if native is None else functools.partial(native, addresses))


def _converted(bias: torch.Tensor) -> torch.Tensor:
    """A bias of another float dtype as the kernels read it: fp32, contiguous (`_bias_layout`)."""
    return bias.to(torch.float32).contiguous()


def _bias_layout(bias: torch.Tensor | None) -> tuple[torch.dtype, int]:
    """(the dtype the kernels read `bias` as, its stride), `_converted`'s where it is not native."""
    if bias is None:
        return torch.float32, 0
    return (bias.dtype, bias.stride(0)) if _native_bias(bias) else (torch.float32, 1)


def _quantizer(kernel_file: str, expr_head: str, src_args: tuple, tail_args: tuple, shape: tuple[int, int],
               scale_strides: tuple[int, int], block: tuple[int, int], vec: int, profile,
               device: torch.device) -> Launcher:
    """The launcher of a blockquant.cuh kernel writing a contiguous q of `shape`: `src_args` describe
    the input, then q, its row stride, the scale and its strides, then `tail_args` (sizes, eps, ue8m0);
    template args are appended to `expr_head` (VEC, TEAM, CACHE). A call passes the input's
    addresses (`POINTER`s in `src_args`), then q's and the scale's."""
    rows, cols = shape
    nblocks = math.ceil(rows / block[0]) * math.ceil(cols / block[1])
    if nblocks >= 2**31:
        raise UnsupportedError(f"cupy quantize: {nblocks} scale blocks, kernels index fewer than 2^31")
    team, cache = _team(block[0] * math.ceil(min(block[1], cols) / vec), vec)
    grid = max(1, min(math.ceil(nblocks / (_QUANT_THREADS // team)), 32 * max(1, profile.sm_count)))
    args = (*src_args, POINTER, i64(cols), POINTER, i64(scale_strides[0]), i64(scale_strides[1]), *tail_args)
    return _kernel(kernel_file, f"{expr_head}, {vec}, {team}, {cache}>", profile, device, (grid,),
                   (_QUANT_THREADS,), args)


def _float_quantizer(src: torch.Tensor, qdtype, block: tuple[int, int], scale_strides: tuple[int, int], ue8m0,
                     eps, profile) -> Callable[..., None]:
    """quant.cu's quant_kernel for a bf16/fp16/fp32 `src` [R, C] in `block` blocks: a launch taking the
    addresses of src, q and the scale (or nothing to do for an empty src)."""
    R, C = src.shape
    if not (R and C):
        return _nothing
    ld = _row_stride(src)
    vec = _vector_width(16 // src.element_size(), (C, ld, block[1]), (src,))
    return _quantizer("quant.cu", f"qc::quant_kernel<{_CTYPE[src.dtype]}, {_QTYPE[qdtype]}", (POINTER, i64(ld)),
                      (i32(R), i32(C), i32(block[0]), i32(block[1]), f32(eps), i32(bool(ue8m0))), (R, C),
                      scale_strides, block, vec, profile, src.device)


@prepared
def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    """Quantize activations per 1 x group_size block along K.

    x [M, K] bf16/fp16/fp32 (row stride arbitrary) -> (q [M, K] qdtype contiguous,
    scale [M, ceil(K/G)] fp32; with `scale_m_major` the transpose view of a contiguous
    [ceil(K/G), M] buffer).
    """
    (M, K), device = x.shape, x.device
    kb = math.ceil(K / group_size)
    buffer = (kb, M) if scale_m_major else (M, kb)
    launch = _float_quantizer(x, qdtype, (1, group_size), (1, M) if scale_m_major else (kb, 1), ue8m0, eps, profile)
    new_q, new_scale = allocator((M, K), qdtype, device), allocator(buffer, torch.float32, device)
    outputs = {"_q": new_q, "_scale": transposed(new_scale) if scale_m_major else new_scale}
    return by_address(_run("x", outputs, launch, ("x", "_q", "_scale"), None, "_q, _scale"))


@prepared
def weight_quant(w, *, qdtype, block_n, block_k, ue8m0, eps, profile):
    """Quantize weights per block_n x block_k block.

    w [N, K] bf16/fp16/fp32 -> (q [N, K] qdtype contiguous, scale [ceil(N/Bn), ceil(K/Bk)] fp32).
    """
    (N, K), device = w.shape, w.device
    grid = (math.ceil(N / block_n), math.ceil(K / block_k))
    launch = _float_quantizer(w, qdtype, (block_n, block_k), (grid[1], 1), ue8m0, eps, profile)

    outputs = {"_q": allocator((N, K), qdtype, device), "_scale": allocator(grid, torch.float32, device)}
    return by_address(_run("w", outputs, launch, ("w", "_q", "_scale"), None, "_q, _scale"))


@prepared
def quantized_gelu(q, scale, *, group_size, approximate, out_qdtype, ue8m0, eps, profile):
    """GELU on quantized activations: dequantize (fp32(q) * scale), GELU in fp32 ("none": erf,
    "tanh": tanh approximation), re-quantize per 1 x group_size.

    q [M, K] fp8/int8, scale [M, ceil(K/G)] fp32 (any strides) -> (q2 [M, K] out_qdtype,
    scale2 [M, ceil(K/G)] fp32), both contiguous.
    """
    (M, K), device = q.shape, q.device
    kb = math.ceil(K / group_size)
    launch = _nothing
    if M and K:
        ldq = _row_stride(q)
        vec = _vector_width(16, (K, ldq, group_size), (q,))
        tanh = "true" if approximate == "tanh" else "false"
        launch = _quantizer(
            "epilogue.cu", f"qc::quantized_gelu_kernel<{_QTYPE[q.dtype]}, {_QTYPE[out_qdtype]}, {tanh}",
            (POINTER, i64(ldq), POINTER, i64(scale.stride(0)), i64(scale.stride(1))),
            (i32(M), i32(K), i32(group_size), f32(eps), i32(bool(ue8m0))), (M, K), (kb, 1), (1, group_size), vec,
            profile, device)

    outputs = {"_q": allocator((M, K), out_qdtype, device), "_scale": allocator((M, kb), torch.float32, device)}
    return by_address(_run("q, scale", outputs, launch, ("q", "scale", "_q", "_scale"), None, "_q, _scale"))


def _rowwise_grid(rows: int, vectors_per_row: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(grid, block) for the row-wise elementwise kernels: 256 threads, as many along a row as it
    has vectors (a power of two), the rest over rows."""
    bx = min(256, 1 << max(0, vectors_per_row - 1).bit_length())
    by = 256 // bx
    return (math.ceil(vectors_per_row / bx), min(math.ceil(rows / by), _MAX_GRID)), (bx, by)


def _dequantizer(q, scale, block: tuple[int, int], out_dtype, profile):
    """quant.cu's dequant_kernel: a function (q, scale) -> fp32(q) * scale per block, as out_dtype."""
    (R, C), device = q.shape, q.device
    launch = _nothing
    if R and C:
        ldq = _row_stride(q)
        vec = _vector_width(16, (C, ldq, block[1]), (q,))
        grid, threads = _rowwise_grid(R, C // vec)
        launch = _kernel("quant.cu", f"qc::dequant_kernel<{_QTYPE[q.dtype]}, {_CTYPE[out_dtype]}, {vec}>", profile,
                         device, grid, threads,
                         (POINTER, i64(ldq), POINTER, i64(scale.stride(0)), i64(scale.stride(1)), POINTER, i64(C),
                          i32(R), i32(C), i32(block[0]), i32(block[1])))

    outputs = {"_out": allocator((R, C), out_dtype, device)}
    return by_address(_run("q, scale", outputs, launch, ("q", "scale", "_out"), None, "_out"))


@prepared
def act_dequant(q, scale, *, group_size, out_dtype, profile):
    """x = fp32(q) * scale[m, k // G], rounded to out_dtype.

    q [M, K] fp8/int8, scale [M, ceil(K/G)] fp32 (any strides) -> x [M, K] out_dtype
    (bf16/fp16/fp32) contiguous.
    """
    return _dequantizer(q, scale, (1, group_size), out_dtype, profile)


@prepared
def weight_dequant(q, scale, *, block_n, block_k, out_dtype, profile):
    """w = fp32(q) * scale[n // Bn, k // Bk], rounded to out_dtype.

    q [N, K] fp8/int8, scale [ceil(N/Bn), ceil(K/Bk)] fp32 -> w [N, K] out_dtype contiguous.
    """
    return _dequantizer(q, scale, (block_n, block_k), out_dtype, profile)


@prepared
def dequant_bias(g, scale_a, scale_b, bias, *, out_dtype, profile):
    """out = fp32(g) * scale_a[m] * scale_b[n] + fp32(bias[n]), left to right in fp32.

    g [M, N] bf16/fp16/fp32/int32, scale_a [M] fp32, scale_b [N] fp32 (any strides), bias [N] any
    float dtype or None -> out [M, N] out_dtype contiguous.
    """
    (M, N), device = g.shape, g.device
    launch = _nothing
    if M and N:
        ldg = _row_stride(g)
        vec = _vector_width(16 // g.element_size(), (N, ldg), (g,))
        grid, threads = _rowwise_grid(M, N // vec)
        bias_dtype, bias_s = _bias_layout(bias)
        launch = _kernel("epilogue.cu", f"qc::dequant_bias_kernel<{_CTYPE[g.dtype]}, {_CTYPE[out_dtype]}, "
                         f"{_CTYPE[bias_dtype]}, {vec}>", profile, device, grid, threads,
                         (POINTER, i64(ldg), POINTER, i64(scale_a.stride(0)), POINTER, i64(scale_b.stride(0)),
                          POINTER, i64(bias_s), POINTER, i64(N), i32(M), i32(N)))
    run = _run("g, scale_a, scale_b, bias=None", {"_out": allocator((M, N), out_dtype, device)}, launch,
               ("g", "scale_a", "scale_b", _bias_name(bias), "_out"), bias, "_out")
    # A bias converted per call is read as a tensor.
    return by_address(run) if _native_bias(bias) else run


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
#
# quant_linear of at most FUSED_M_MAX rows is one launch: each program quantizes its rows' K range of
# the activation in its prologue (gemm.cu) into shared memory, codes and scales (`fused_a_bytes`), in
# place of A's stage ring, where that fits beside as many weight stages as the two-launch path keeps at
# the tile's CTAs per SM (as much weight in flight). Every program of an output column repeats that
# work, so its GPU cost grows with M. Measured on the H100, against
# act_quant + the GEMM over the decode shapes: GPU time 1.04-1.05x at M = 1, 0.92-0.93x at M = 4 and
# 0.78-0.80x at M = 8, while a back-to-back call took 19-33 µs against 46-58 at every M: the host's
# second launch outweighs the prologue's GPU cost up to 4 rows, not at 8.
#
# From FUSED_M_MAX + 1 to ONCE_M_MAX rows the programs quantize the activation once between them into
# a workspace (gemm.cu's ONCE, the Triton decode kernel's protocol), eagerly only (`runtime.launch.eagerly`).
# Measured on the H100, against act_quant + the GEMM:
# GPU time 1.33-1.41x in geometric mean over the nine decode shapes at M = 8-32, eager time per call
# 0.654x where the bounds hold (30 of 30 faster: 19-35 µs against 27-45); the model's eager decode
# step 5-12 % faster. Larger weights or more rows: the GPU bounds the
# call and the one launch loses (eager 1.11x outside the weight bound, 1.16x at 64 rows).


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
FUSED_M_MAX = 4
# Quantized once per launch: where the host's second launch costs more than the GPU time the wait adds;
# at most one row tile (gemm.cu's ONCE).
ONCE_M_MAX = 32
ONCE_NK_MAX = 2**25
# gemm_kernel's parameters of a grouped launch (cupy/grouped.py), unused by a dense one: no expert table, no
# experts, expert strides 0.
UNGROUPED = (i64(0), i32(0), *(i64(0),) * 7)


def gemm_tile(M: int, out_group: int | None = None) -> GemmTile:
    """The tile for M rows: a decode tile holding all M <= 64 rows (BN = 64, or 128 when a
    re-quantize group `out_group` is wider than 64 columns), else the 128 x 128 tile."""
    if M > 64:
        return _LARGE_TILE
    bm = 16 if M <= 16 else 32 if M <= 32 else 64
    return GemmTile(bm, 128 if out_group and out_group > 64 else 64, 1, 4, 128, 2)


def gemm_stages(tile: GemmTile, smem_per_block: int, a_bytes: int | None = None) -> tuple[int, int]:
    """(STAGES, dynamic shared bytes): enough stages to keep 32 KB of weight in flight, as many as
    fit `tile.per_sm` CTAs in the profile's shared memory (at least 2); the epilogue reuses the same
    memory for one warp row of fp32 results. `a_bytes`: A held whole (`fused_a_bytes`), stages then
    hold only weight tiles."""
    stage = (tile.bn if a_bytes is not None else tile.bm + tile.bn) * tile.bk
    wanted = 1 + math.ceil(_WEIGHT_IN_FLIGHT / (tile.bn * tile.bk))
    stages = max(2, min(wanted, ((smem_per_block or 48 * 1024) // tile.per_sm - (a_bytes or 0)) // stage))
    return stages, max((a_bytes or 0) + stages * stage, (tile.bm // tile.wm) * (tile.bn + 8) * 4)


def fused_a_bytes(tile: GemmTile, k_split: int, block_k: int) -> int:
    """Shared memory of a fused quant_linear's quantized activation: BM rows of the K range rounded up
    to whole stages plus 16 bytes (gemm.cu's `fused_row_bytes`), then BM x (k_split / block_k) fp32
    scales, rounded up to 16 bytes."""
    row = math.ceil(k_split / tile.bk) * tile.bk + 16
    return tile.bm * row + math.ceil(tile.bm * (k_split // block_k) * 4 / 16) * 16


def gemm_splits(M: int, N: int, K: int, block_k: int, tile: GemmTile, sm_count: int) -> tuple[int, int]:
    """(K blocks per split, splits): split K only when the output tiles are fewer than the resident
    programs (`tile.per_sm` per SM), into as many equal ranges of whole K blocks as fill them."""
    tiles = math.ceil(M / tile.bm) * math.ceil(N / tile.bn)
    kblocks = max(1, math.ceil(K / block_k))
    per_split = math.ceil(kblocks / max(1, min(kblocks, tile.per_sm * sm_count // tiles)))
    return per_split, math.ceil(kblocks / per_split)


def gemm_kernel_name(mma: str, tile: GemmTile, stages: int, aligned: bool, a_type: str = "qc::u8",
                     once: bool = False, grouping: int = 0) -> str:
    """The gemm.cu template instantiation for one configuration; `mma` is "fp8", "int8" or "fp16";
    `a_type` the element type of A: codes, or a float activation quantized in the prologue (by each
    program, or `once` per launch into a workspace); `grouping` gemm.cu's Grouping (0: a dense GEMM)."""
    bm, bn, wm, wn, bk, _ = tile
    grouped = f", {grouping}" if grouping else ""
    return (f"qc::gemm_kernel<{MMA_KIND[mma]}, {a_type}, {bm}, {bn}, {wm}, {wn}, {bk}, {stages}, "
            f"{'true' if aligned else 'false'}, {'true' if once else 'false'}{grouped}>")


def _gemm(a, a_scale, b, b_scale, bias, *, block_n, block_k, activation, out_kind, out_group, ue8m0_out, eps,
          mma, profile, a_quant: tuple[float, bool] | None = None, once: bool = False) -> Callable[..., None] | None:
    """The gemm.cu launch for operands (and a bias: None, or as `_bias_layout` reads it) laid out as these
    and an output of dtype `out_kind` (re-quantized per 1 x out_group when 8-bit): a function of the
    addresses of a, a_scale, b, b_scale, bias (0: none), out and out's scale (0: none). With `a_quant`
    (act_quant's eps and ue8m0) `a` is a float activation that the kernel quantizes (a_scale unused): in
    each program's prologue, None where its codes would not fit in shared memory beside the weight stages
    of the unfused kernel; or `once` per launch into a workspace (M <= 64, one row tile), None where that
    workspace cannot be had (it would grow while a graph is captured)."""
    M, K = a.shape
    N = b.shape[0]
    if M == 0 or N == 0:
        return _nothing
    if b.dtype != _MMA_READS[mma] or (a_quant is None and a.dtype != b.dtype):
        raise UnsupportedError(f"cupy scaled_mm: the {mma!r} MMA kernel reads {_MMA_READS[mma]}, got a {a.dtype} "
                               f"and b {b.dtype}")
    requant = out_kind in _QTYPE
    tile = gemm_tile(M, out_group if requant else None)
    lda, ldb = _row_stride(a), _row_stride(b)
    aligned = all(v % 16 == 0 for v in (K, ldb, b.data_ptr(), *(() if a_quant else (lda, a.data_ptr()))))
    kb_per_split, splits = gemm_splits(M, N, K, block_k, tile, max(1, profile.sm_count))
    tiles = math.ceil(M / tile.bm) * math.ceil(N / tile.bn)
    # The plan keeps the workspace's addresses: a replaced pair stays allocated (backends/workspace.py).
    split = splits > 1
    if once:
        work = workspace.once_buffers(a.device, tiles * splits * tile.bm * tile.bn if split else 0,
                                      tiles if split else 0, M, K, block_k)
        if work is None:
            return None
        pair, codes = work[:2] if split else None, work[2:]
    else:
        pair, codes = workspace.buffers(a.device, tiles * splits * tile.bm * tile.bn, tiles) if split else None, None
    if pair is None:  # unsplit, or the buffers cannot grow now (a stream being captured): this plan runs unsplit
        kb_per_split, splits = kb_per_split * splits, 1
    ws, counters = pair or (None, None)
    a_bytes = fused_a_bytes(tile, kb_per_split * block_k, block_k) if a_quant and not once else None
    stages, smem = gemm_stages(tile, profile.smem_per_block, a_bytes)
    if a_bytes and (smem > (profile.smem_per_block or 48 * 1024) // tile.per_sm
                    or stages < gemm_stages(tile, profile.smem_per_block)[0]):
        return None  # the activation's codes would not fit, or would leave less weight in flight
    as_strides = (0, 0) if a_scale is None else a_scale.stride()
    bias_dtype, bias_s = _bias_layout(bias)
    args = (POINTER, i64(lda), POINTER, i64(as_strides[0]), i64(as_strides[1]),
            POINTER, i64(ldb), POINTER, i64(b_scale.stride(0)), i64(b_scale.stride(1)),
            POINTER, i64(bias_s), i32(_BIAS_KIND[bias_dtype]),
            POINTER, i64(N), POINTER, i64(math.ceil(N / out_group) if requant else 0), i64(1),
            i64(_address(ws)), i64(_address(counters)), *(i64(_address(t)) for t in codes or (None,) * 3),
            i32(M), i32(N), i32(K), i32(block_n), i32(block_k), i32(kb_per_split * block_k),
            i32(_ACTIVATION[activation]), i32(_OUT_KIND[out_kind]), i32(out_group or 1), i32(bool(ue8m0_out)),
            f32(eps), f32(a_quant[0] if a_quant else 0.0), i32(bool(a_quant and a_quant[1])), *UNGROUPED)
    a_type = _A_TYPE[a.dtype] if a_quant else "qc::u8"
    return _kernel("gemm.cu", gemm_kernel_name(mma, tile, stages, aligned, a_type, once), profile, a.device,
                   (math.ceil(M / tile.bm), math.ceil(N / tile.bn), splits), (tile.wm * tile.wn * 32,), args, smem)


@prepared
def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant,
              out_group, ue8m0_out, eps, mma, profile, lead=None):
    """Block-scaled GEMM a @ b.T with the contract's epilogues, in one launch (split-K included).

    a [M, K] fp8/int8, a_scale [M, ceil(K/Bk)] fp32 (any strides), b [N, K] same dtype,
    b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides), bias [N] float or None, activation
    None/"gelu"/"gelu_tanh"/"silu". Returns out [M, N] out_dtype (bf16/fp16/fp32), or with
    `out_quant` (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32). `mma` is the tensor-core
    path of the implementation the registry chose: "fp8" (e4m3 MMA, sm_89+), "int8", or "fp16"
    (FP8 expanded exactly to fp16). The registry guarantees block_k % 32 == 0 and, when
    re-quantizing, out_group a power of two <= 128. When K is split, the partials are summed in split
    order (docs/numerics.md), so results are bit-for-bit the same from run to run on one device.
    `lead`: the results' leading dims in place of M (`runtime.launch.prepared`).
    """
    M, N, device = a.shape[0], b.shape[0], a.device
    rows = (M,) if lead is None else tuple(lead)
    out_kind = out_dtype if out_quant is None else out_quant
    groups = math.ceil(N / out_group) if out_quant is not None else 0
    launch = _gemm(a, a_scale, b, b_scale, bias, block_n=block_n, block_k=block_k, activation=activation,
                   out_kind=out_kind, out_group=out_group, ue8m0_out=ue8m0_out, eps=eps, mma=mma, profile=profile)
    outputs = {"_out": allocator((*rows, N), out_kind, device)}
    if groups:
        outputs["_scale"] = allocator((*rows, groups), torch.float32, device)
    run = _run("a, a_scale, b, b_scale, bias=None", outputs, launch,
               ("a", "a_scale", "b", "b_scale", _bias_name(bias), "_out", "_scale" if groups else None), bias,
               "_out, _scale" if groups else "_out")
    return by_address(run) if _native_bias(bias) else run


@prepared
def quant_linear(x, w, w_scale, *, block_n, block_k, bias, activation, out_dtype, ue8m0, eps, mma, profile, lead=None):
    """act_quant(x) per 1 x block_k group into w's format, then scaled_mm with w, bit for bit the two
    ops, for groups of at most 128 in one launch: up to FUSED_M_MAX rows each program quantizes its K
    range of x in its prologue (where that fits shared memory: `_gemm`); up to ONCE_M_MAX rows and
    weights of ONCE_NK_MAX elements the programs quantize x once between them, outside graph captures
    only (`runtime.launch.eagerly`). Elsewhere as the two launches.

    x [M, K] bf16/fp16/fp32, w [N, K] fp8_e4m3fn/int8, w_scale [ceil(N/Bn), ceil(K/Bk)] fp32, bias [N]
    float or None -> out [M, N] out_dtype. `ue8m0` and `eps` are the activation quantization's; `mma`
    and `lead` as for scaled_mm.
    """
    (M, K), N = x.shape, w.shape[0]
    fused, once = None, 0 < M <= ONCE_M_MAX and N * K <= ONCE_NK_MAX and M > FUSED_M_MAX
    if 0 < M <= (ONCE_M_MAX if once else FUSED_M_MAX) and block_k <= 128:  # a lane keeps block_k / 8 values
        fused = _gemm(x, None, w, w_scale, bias, block_n=block_n, block_k=block_k, activation=activation,
                      out_kind=out_dtype, out_group=None, ue8m0_out=False, eps=0.0, mma=mma, profile=profile,
                      a_quant=(eps, ue8m0), once=once)
    composed = None if fused and not once else prepared_quant_linear(
        act_quant, scaled_mm, x, w, w_scale, block_n=block_n, block_k=block_k, bias=bias, activation=activation,
        out_dtype=out_dtype, ue8m0=ue8m0, eps=eps, profile=profile, mma=mma, lead=lead)
    if fused is None:
        return composed
    new_out = allocator((*((M,) if lead is None else lead), N), out_dtype, x.device)
    run = _run("x, w, w_scale, bias=None", {"_out": new_out},
               fused, ("x", None, "w", "w_scale", _bias_name(bias), "_out", None), bias, "_out")
    run = by_address(run) if _native_bias(bias) else run
    return eagerly(run, composed, x.device) if once else run
