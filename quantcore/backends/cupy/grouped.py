"""Launch functions of the grouped (mixture-of-experts) block-scaled GEMMs on the CuPy backend: gemm.cu's
`gemm_kernel` with a Grouping, which runs the dense program on one expert's rows and weight.

Expert weights are stacked: b [E, N, K] fp8_e4m3fn or int8 (K-contiguous), b_scale [E, ceil(N/Bn), ceil(K/Bk)]
fp32. Each expert's rows get what `launch.scaled_mm` computes for them with K unsplit (the same MMAs in the same
K order, scaling and epilogue), so scaled_mm's split-K launches (decode-sized M with few output tiles), which
sum the same K blocks in another order, are the one place where the two differ in the last bits. Row counts
are read on the device: a run never synchronizes with the host, and can be captured in a CUDA graph.

The tile is the dense GEMM's for an expert's expected rows (`launch.gemm_tile`): a decode tile holding up to
64 rows, else 128 x 128; K is never split. Both functions are `prepared`, as `launch.scaled_mm`.
"""

from __future__ import annotations

import math

import torch

from ...errors import InvalidInputError, UnsupportedError
from ...runtime.launch import allocator, by_address, prepared
from .launch import (_ACTIVATION, _BIAS_KIND, _MMA_READS, _OUT_KIND, _QTYPE, _bias_layout, _bias_name, _kernel,
                     _native_bias, _nothing, _run, gemm_kernel_name, gemm_stages, gemm_tile)
from .launcher import POINTER, f32, i32, i64

_CONTIGUOUS, _MASKED = 1, 2  # gemm.cu's Grouping


def _grouped(a, a_scale, b, b_scale, rows, bias, *, masked, block_n, block_k, activation, out_dtype, out_quant,
             out_group, ue8m0_out, eps, mma, profile):
    """The prepared run of either layout: `rows` is the offsets [E + 1] (contiguous: a [M, K]) or masked_m [E]
    (masked: a [E, max_m, K]), named in the run as the launch function names it."""
    E, N, K = b.shape
    lead, device = tuple(a.shape[:-1]), a.device
    max_m = lead[-1]
    out_kind = out_dtype if out_quant is None else out_quant
    groups = math.ceil(N / out_group) if out_quant is not None else 0
    rows_name = "masked_m" if masked else "expert_offsets"
    outputs = {"_out": allocator((*lead, N), out_kind, device)}
    if groups:
        outputs["_scale"] = allocator((*lead, groups), torch.float32, device)
    if rows.dtype != torch.int32:
        raise InvalidInputError(f"cupy grouped GEMM: {rows_name} must be int32, got {rows.dtype}")
    if b.dtype != _MMA_READS[mma] or a.dtype != b.dtype:
        raise UnsupportedError(f"cupy grouped GEMM: the {mma!r} MMA kernel reads {_MMA_READS[mma]}, got a {a.dtype} "
                               f"and b {b.dtype}")
    launch = _nothing
    if all(lead) and E and N:
        tile = gemm_tile(max_m if masked else math.ceil(max_m / E), out_group if groups else None)
        stages, smem = gemm_stages(tile, profile.smem_per_block)
        # Expert strides in elements; a contiguous layout's activation, scales and output move by rows instead.
        a_e, as_e, out_e, os_e = (a.stride(0), a_scale.stride(0), max_m * N, max_m * groups) if masked else (0,) * 4
        as_m, as_k = a_scale.stride()[-2:]
        bias_dtype, _ = _bias_layout(bias)
        bias_e, bias_s = (0, 0) if bias is None else bias.stride() if _native_bias(bias) else (N, 1)
        lda, ldb = a.stride(-2), b.stride(1)
        aligned = all(v % 16 == 0 for v in (K, lda, ldb, a_e, b.stride(0), a.data_ptr(), b.data_ptr()))
        tiles_n = math.ceil(N / tile.bn)
        grid = ((E * math.ceil(max_m / tile.bm), tiles_n) if masked
                else (min(math.ceil(max_m / tile.bm) + E, max_m), tiles_n))
        args = (POINTER, i64(lda), POINTER, i64(as_m), i64(as_k), POINTER, i64(ldb), POINTER,
                i64(b_scale.stride(1)), i64(b_scale.stride(2)), POINTER, i64(bias_s), i32(_BIAS_KIND[bias_dtype]),
                POINTER, i64(N), POINTER, i64(groups), i64(1), *(i64(0),) * 5,  # no split-K or activation workspace
                i32(max_m), i32(N), i32(K), i32(block_n), i32(block_k), i32(math.ceil(K / block_k) * block_k),
                i32(_ACTIVATION[activation]), i32(_OUT_KIND[out_kind]), i32(out_group or 1), i32(bool(ue8m0_out)),
                f32(eps), f32(0.0), i32(0),
                POINTER, i32(E), i64(a_e), i64(as_e), i64(b.stride(0)), i64(b_scale.stride(0)), i64(bias_e),
                i64(out_e), i64(os_e))
        name = gemm_kernel_name(mma, tile, stages, aligned, grouping=_MASKED if masked else _CONTIGUOUS)
        launch = _kernel("gemm.cu", name, profile, device, grid, (tile.wm * tile.wn * 32,), args, smem)
    run = _run(f"a, a_scale, b, b_scale, {rows_name}, bias=None", outputs, launch,
               ("a", "a_scale", "b", "b_scale", _bias_name(bias), "_out", "_scale" if groups else None, rows_name),
               bias, "_out, _scale" if groups else "_out")
    return by_address(run) if _native_bias(bias) else run


@prepared
def grouped_mm(a, a_scale, b, b_scale, expert_offsets, *, block_n, block_k, bias, activation, out_dtype, out_quant,
               out_group, ue8m0_out, eps, mma, profile):
    """Grouped block-scaled GEMM, contiguous layout (prefill): out[r] = a[r] @ b[e]^T for the rows r of each
    expert e, with scaled_mm's fused epilogue.

    a [M, K] fp8_e4m3fn/int8, rows sorted by expert; a_scale [M, ceil(K/Bk)] fp32 (any strides); b [E, N, K]
    (a's dtype, K-contiguous), b_scale [E, ceil(N/Bn), ceil(K/Bk)] fp32; expert_offsets int32 [E + 1] on the
    device, non-decreasing (expert e's rows are offsets[e]:offsets[e+1]; empty experts allowed, no padding);
    bias [E, N] float or None; activation None/"gelu"/"gelu_tanh"/"silu". Returns out [M, N] out_dtype
    (bf16/fp16/fp32), or with out_quant (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32) re-quantized
    per 1×out_group. Rows outside offsets[0]:offsets[E] are left unwritten. `mma` as `launch.scaled_mm`'s
    ("fp8", "int8" or "fp16"); block_k a multiple of 32, out_group a power of two <= 128 when re-quantizing.
    """
    return _grouped(a, a_scale, b, b_scale, expert_offsets, bias, masked=False, block_n=block_n, block_k=block_k,
                    activation=activation, out_dtype=out_dtype, out_quant=out_quant, out_group=out_group,
                    ue8m0_out=ue8m0_out, eps=eps, mma=mma, profile=profile)


@prepared
def grouped_mm_masked(a, a_scale, b, b_scale, masked_m, *, block_n, block_k, bias, activation, out_dtype, out_quant,
                      out_group, ue8m0_out, eps, mma, profile):
    """Grouped block-scaled GEMM, masked layout (decode; fixed shapes for CUDA graphs): out[e, r] = a[e, r] @
    b[e]^T for r < masked_m[e], with scaled_mm's fused epilogue.

    a [E, max_m, K] fp8_e4m3fn/int8 (K-contiguous), a_scale [E, max_m, ceil(K/Bk)] fp32 (any strides),
    masked_m int32 [E] on the device (clamped to 0..max_m); b, b_scale, bias and the options as `grouped_mm`'s.
    Returns out [E, max_m, N] out_dtype, or (q [E, max_m, N] out_quant, scale [E, max_m, ceil(N/out_group)]
    fp32); rows r >= masked_m[e] are left unwritten.
    """
    return _grouped(a, a_scale, b, b_scale, masked_m, bias, masked=True, block_n=block_n, block_k=block_k,
                    activation=activation, out_dtype=out_dtype, out_quant=out_quant, out_group=out_group,
                    ue8m0_out=ue8m0_out, eps=eps, mma=mma, profile=profile)
