"""Launch functions of the grouped (mixture-of-experts) block-scaled GEMMs on Triton (`kernels/grouped.py`).

Expert weights are stacked: b [E, N, K] fp8_e4m3fn or int8 (K-contiguous), b_scale [E, ceil(N/Bn), ceil(K/Bk)]
fp32. Each expert's rows get what `launch.scaled_mm` computes for them with K unsplit (bit for bit: the same
tile program, K loop and epilogue), so scaled_mm's split-K launches (decode-sized M with few output tiles),
which sum the same K blocks in another order, are the one place where the two differ in the last bits.

Both functions are `prepared` like `launch.scaled_mm`: the plan fixes tiles, grid and constants; a run
allocates the outputs and launches once, reading the row counts on the device (no host synchronization, so a
run can be captured in a CUDA graph). Tiles come from the dense GEMM's table (`configs.gemm_candidates`) for an
expert's expected rows, loaded through TMA on Hopper-class GPUs from 64-row tiles (pointers elsewhere, and
for decode-sized launches, whose plans the native launch path replays) and never split.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton

from ...errors import InvalidInputError
from ...runtime.launch import by_address, compose, prepared
from . import configs
from .direct import Launcher
from .kernels.grouped import grouped_mm_kernel
from .kernels.quant import scales_may_be_tiny
from .launch import (_GROUP_M, _KIND, _MMA_KINDS, TensorDescriptor, _bias_expression, _bias_kind, _gemm_outputs,
                     _hw_fp8, _native_bias, flat_rows)
from .launch import _tma_ready as _dense_tma_ready

# TMA from 64-row tiles (prefill) only: decode-sized launches (an expert's few rows) keep pointer loads and with
# them a plan replayed by address (the native launch path), as the dense decode kernel's; TMA descriptors are
# made again on each Python call.
TMA_MIN_BLOCK_M = 64


def tile(profile, rows: int, N: int, K: int, *, mma: str, block_k: int, min_block_n: int) -> configs.GemmConfig:
    """The tile of a grouped launch whose experts hold about `rows` rows each: the dense GEMM's first candidate
    for that M, its BLOCK_M cut to the rows (at least 16, the MMA's), K unsplit, through TMA where the dense
    GEMM's would be."""
    cfg = configs.gemm_candidates(profile, max(rows, 1), N, K, mma=mma, block_k=block_k, min_block_n=min_block_n)[0]
    return replace(configs.unsplit(cfg), block_m=min(cfg.block_m, max(16, triton.next_power_of_2(rows))))


def _rows_descriptor(t: torch.Tensor, block_shape: list[int]):
    """The TMA descriptor of `t` [..., R, K] (K-contiguous, leading dims flattenable) as one [rows, K] matrix."""
    return TensorDescriptor(t, [t.numel() // t.shape[-1], t.shape[-1]], [t.stride(-2), 1], block_shape)


def _tma_ready(a: torch.Tensor, b: torch.Tensor, profile) -> bool:
    """Whether a and b can be read as [rows, K] matrices through TMA: the dense GEMM's conditions
    (`launch._tma_ready`: sm_90+, 16-byte aligned bases) and `launch.flat_rows`."""
    return flat_rows(a) and flat_rows(b) and _dense_tma_ready(a, b, profile)


def _grouped(a, a_scale, b, b_scale, rows, bias, *, masked, block_n, block_k, activation, out_dtype, out_quant,
             out_group, ue8m0_out, eps, profile, mma):
    """The prepared run of either layout: `rows` is the offsets [E + 1] (contiguous: a [M, K]) or masked_m [E]
    (masked: a [E, max_m, K]), named in the run as the launch function names it."""
    E, N, K = b.shape
    lead = tuple(a.shape[:-1])
    quantized = out_quant is not None
    rows_name = "masked_m" if masked else "expert_offsets"
    params, result = f"a, a_scale, b, b_scale, {rows_name}, bias=None", "_out, _scale" if quantized else "_out"
    outputs = _gemm_outputs(lead[-1], N, a.device, out_dtype, out_quant, out_group, lead)
    if rows.dtype != torch.int32:
        raise InvalidInputError(f"triton grouped GEMM: {rows_name} must be int32, got {rows.dtype}")
    if not (all(lead) and E and N):
        return by_address(compose(params, outputs, "", {}, result))
    qfmt = _KIND[b.dtype]
    if mma not in _MMA_KINDS[qfmt]:
        raise InvalidInputError(f"triton grouped {qfmt} GEMM: mma={mma!r} cannot multiply {qfmt} operands; expected "
                                f"one of {_MMA_KINDS[qfmt]} (the Impl's `mma` option)")
    max_m = lead[-1]
    cfg = tile(profile, max_m if masked else triton.cdiv(max_m, E), N, K, mma=mma, block_k=block_k,
               min_block_n=out_group if quantized else 1)
    n_tiles = triton.cdiv(N, cfg.block_n)
    tma = cfg.tma and cfg.block_m >= TMA_MIN_BLOCK_M and _tma_ready(a, b, profile)
    descriptors = {2: functools.partial(_rows_descriptor, block_shape=[cfg.block_m, block_k]),
                   3: functools.partial(_rows_descriptor, block_shape=[cfg.block_n, block_k])} if tma else None
    # Contiguous: a program per output tile of the bound of ceil(M/BLOCK_M) + E row tiles (at most M: a tile
    # has a row), in the kernel's L2 order.
    grid = ((triton.cdiv(max_m, cfg.block_m), n_tiles, E) if masked
            else (min(triton.cdiv(max_m, cfg.block_m) + E, max_m) * n_tiles,))
    groups = triton.cdiv(N, out_group) if quantized else 0
    # Expert strides of the activation, its scales and the (contiguous) outputs: 0 where the expert's first
    # row places them (contiguous).
    a_strides = (a.stride(0), a.stride(1)) if masked else (0, a.stride(0))
    as_strides = a_scale.stride() if masked else (0, *a_scale.stride())
    out_strides = (max_m * N if masked else 0, N, max_m * groups if masked else 0, groups)
    bias_strides = (0, 0) if bias is None else bias.stride()
    launch = Launcher(grouped_mm_kernel, grid, dict(
        MASKED=masked, QFMT=qfmt, USE_FP8_MMA=mma == "fp8", TMA=tma, SCALE_BN=block_n, BIAS=_bias_kind(bias),
        ACTIVATION=activation or "none", OUT=_KIND[out_quant or out_dtype], OUT_GROUP=out_group if quantized else 1,
        UE8M0_OUT=bool(ue8m0_out), TINY_SCALES=scales_may_be_tiny(eps, out_quant or out_dtype), HW_FP8=_hw_fp8(profile),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, K_STEP=cfg.k_step,
        BLOCK_KS=cfg.step_k(block_k, tma), E_PAD=triton.next_power_of_2(E), GROUP_M=_GROUP_M, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages), a.device, descriptors,
        fixed=(E, max_m, N, K, *a_strides, *b.stride()[:2], *as_strides, *b_scale.stride(), *bias_strides,
               *out_strides, eps))
    run = launch.function(params, ("a", "b", "a" if tma else None, "b" if tma else None, "a_scale", "b_scale",
                                   _bias_expression(bias), "_out", "_scale" if quantized else None, rows_name),
                          outputs, result)
    # Descriptors read the operands' shapes and strides.
    return by_address(run) if not tma and _native_bias(bias) else run


@prepared
def grouped_mm(a, a_scale, b, b_scale, expert_offsets, *, block_n, block_k, bias, activation, out_dtype, out_quant,
               out_group, ue8m0_out, eps, profile, mma):
    """Grouped block-scaled GEMM, contiguous layout (prefill): out[r] = a[r] @ b[e]^T for the rows r of each
    expert e, with scaled_mm's fused epilogue.

    a [M, K] fp8_e4m3fn/int8, rows sorted by expert; a_scale [M, ceil(K/Bk)] fp32 (any strides); b [E, N, K]
    (a's dtype, K-contiguous), b_scale [E, ceil(N/Bn), ceil(K/Bk)] fp32; expert_offsets int32 [E + 1] on the
    device, non-decreasing (expert e's rows are offsets[e]:offsets[e+1]; empty experts allowed, no padding);
    bias [E, N] bf16/fp16/fp32 or None; activation None/"gelu"/"gelu_tanh"/"silu". Returns out [M, N]
    out_dtype (bf16/fp16/fp32), or with out_quant (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32)
    re-quantized per 1×out_group. Rows outside offsets[0]:offsets[E] are left unwritten. `mma` as
    `launch.scaled_mm`'s ("int8", "fp8" or "fp16"); block_k a power of two >= 16, out_group a power of two.
    """
    return _grouped(a, a_scale, b, b_scale, expert_offsets, bias, masked=False, block_n=block_n, block_k=block_k,
                    activation=activation, out_dtype=out_dtype, out_quant=out_quant, out_group=out_group,
                    ue8m0_out=ue8m0_out, eps=eps, profile=profile, mma=mma)


@prepared
def grouped_mm_masked(a, a_scale, b, b_scale, masked_m, *, block_n, block_k, bias, activation, out_dtype, out_quant,
                      out_group, ue8m0_out, eps, profile, mma):
    """Grouped block-scaled GEMM, masked layout (decode; fixed shapes for CUDA graphs): out[e, r] = a[e, r] @
    b[e]^T for r < masked_m[e], with scaled_mm's fused epilogue.

    a [E, max_m, K] fp8_e4m3fn/int8 (K-contiguous), a_scale [E, max_m, ceil(K/Bk)] fp32 (any strides),
    masked_m int32 [E] on the device (a count above max_m counts as max_m); b, b_scale, bias and the options
    as `grouped_mm`'s. Returns out [E, max_m, N] out_dtype, or (q [E, max_m, N] out_quant, scale
    [E, max_m, ceil(N/out_group)] fp32); rows r >= masked_m[e] are left unwritten.
    """
    return _grouped(a, a_scale, b, b_scale, masked_m, bias, masked=True, block_n=block_n, block_k=block_k,
                    activation=activation, out_dtype=out_dtype, out_quant=out_quant, out_group=out_group,
                    ue8m0_out=ue8m0_out, eps=eps, profile=profile, mma=mma)
