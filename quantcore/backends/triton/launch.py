"""The seven launch functions of the backend contract (docs/backend-contract.md), on Triton kernels.

Inputs arrive validated by `quantcore.ops`: one device, supported dtypes, agreeing shapes, last dim
of every 2-D operand with stride 1. Kernels see FP8 tensors as uint8 and bf16 tensors as int16
views (see `kernels/fp8.py`, `kernels/cast.py`); everything else as is. This module imports
Triton at its top; quantcore imports it only when a Triton implementation is first launched.
"""

from __future__ import annotations

import torch
import triton
import triton.testing

try:  # host-side TMA descriptors (Triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: pointer loads only
    TensorDescriptor = None

from ... import capability
from . import configs
from .kernels.epilogue import dequant_bias_kernel
from .kernels.gemm import block_scaled_mm_kernel
from .kernels.quant import block_dequant_kernel, block_quant_kernel

_KIND = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "int32",
         torch.float8_e4m3fn: "fp8", torch.int8: "int8"}
_KERNEL_VIEW = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8}
_GROUP_M = 8  # row tiles per L2 group in the GEMM's program order


def _view(t: torch.Tensor) -> torch.Tensor:
    """The tensor as its kernel sees it (same memory and strides)."""
    return t.view(_KERNEL_VIEW[t.dtype]) if t.dtype in _KERNEL_VIEW else t


def _blocks_quantize(src, src_scale, q, scale, *, block, ue8m0, eps, activation, profile):
    """Quantize src per block[0]×block[1] into q and scale (dequantizing it first with src_scale
    when src is itself quantized), applying `activation` in between."""
    R, C = src.shape
    if src.numel() == 0:
        return
    t = configs.block_tiling(R, C, block[0], block[1], profile)
    ss = src if src_scale is None else src_scale
    block_quant_kernel[t.grid](
        _view(src), ss, _view(q), scale, R, C,
        src.stride(0), ss.stride(0), ss.stride(-1), q.stride(0), scale.stride(0), scale.stride(1), eps,
        BR=block[0], BC=block[1], RB=t.rb, CB=t.cb, BR_PAD=t.br_pad, BC_PAD=t.bc_pad,
        SRC=_KIND[src.dtype], QFMT=_KIND[q.dtype], UE8M0=bool(ue8m0), ACTIVATION=activation,
        HW_FP8=_hw_fp8(profile), EVEN=t.even, num_warps=t.num_warps)


def _blocks_dequantize(q, scale, *, block, out_dtype, profile):
    """fp32(q) * scale per block[0]×block[1], as a new out_dtype tensor."""
    R, C = q.shape
    out = torch.empty((R, C), dtype=out_dtype, device=q.device)
    if q.numel() == 0:
        return out
    t = configs.block_tiling(R, C, block[0], block[1], profile)
    block_dequant_kernel[t.grid](
        _view(q), scale, _view(out), R, C, q.stride(0), scale.stride(0), scale.stride(1), out.stride(0),
        BR=block[0], BC=block[1], RB=t.rb, CB=t.cb, BR_PAD=t.br_pad, BC_PAD=t.bc_pad,
        QFMT=_KIND[q.dtype], OUT=_KIND[out_dtype], HW_FP8=_hw_fp8(profile), EVEN=t.even, num_warps=t.num_warps)
    return out


def act_quant(x, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    """Quantize activations per 1×group_size block along the last dim.

    x [M, K] bf16/fp16/fp32 -> (q [M, K] qdtype contiguous, scale [M, ceil(K/G)] fp32). With
    `scale_m_major` the scale is the transpose of a contiguous [ceil(K/G), M] buffer (strides (1, M)).
    """
    M, K = x.shape
    kb = triton.cdiv(K, group_size)
    q = torch.empty((M, K), dtype=qdtype, device=x.device)
    if scale_m_major:
        scale = torch.empty((kb, M), dtype=torch.float32, device=x.device).t()
    else:
        scale = torch.empty((M, kb), dtype=torch.float32, device=x.device)
    _blocks_quantize(x, None, q, scale, block=(1, group_size), ue8m0=ue8m0, eps=eps,
                     activation="none", profile=profile)
    return q, scale


def act_dequant(q, scale, *, group_size, out_dtype, profile):
    """fp32(q) * scale per 1×group_size block, cast to out_dtype.

    q [M, K] fp8_e4m3fn/int8, scale [M, ceil(K/G)] fp32 (any strides) -> x [M, K] out_dtype
    (bf16/fp16/fp32).
    """
    return _blocks_dequantize(q, scale, block=(1, group_size), out_dtype=out_dtype, profile=profile)


def weight_quant(w, *, qdtype, block_n, block_k, ue8m0, eps, profile):
    """Quantize a weight per block_n×block_k block.

    w [N, K] bf16/fp16/fp32 -> (q [N, K] qdtype contiguous, scale [ceil(N/Bn), ceil(K/Bk)] fp32).
    """
    N, K = w.shape
    q = torch.empty((N, K), dtype=qdtype, device=w.device)
    scale = torch.empty((triton.cdiv(N, block_n), triton.cdiv(K, block_k)), dtype=torch.float32,
                        device=w.device)
    _blocks_quantize(w, None, q, scale, block=(block_n, block_k), ue8m0=ue8m0, eps=eps,
                     activation="none", profile=profile)
    return q, scale


def weight_dequant(q, scale, *, block_n, block_k, out_dtype, profile):
    """fp32(q) * scale per block_n×block_k block, cast to out_dtype.

    q [N, K] fp8_e4m3fn/int8, scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides) -> w [N, K] out_dtype.
    """
    return _blocks_dequantize(q, scale, block=(block_n, block_k), out_dtype=out_dtype, profile=profile)


def quantized_gelu(q, scale, *, group_size, approximate, out_qdtype, ue8m0, eps, profile):
    """GELU of dequantized activations, re-quantized per 1×group_size, in one pass.

    q [M, K] fp8_e4m3fn/int8, scale [M, ceil(K/G)] fp32 (any strides), approximate "none"/"tanh"
    -> (q2 [M, K] out_qdtype contiguous, scale2 [M, ceil(K/G)] fp32 contiguous).
    """
    M, K = q.shape
    q2 = torch.empty((M, K), dtype=out_qdtype, device=q.device)
    scale2 = torch.empty((M, triton.cdiv(K, group_size)), dtype=torch.float32, device=q.device)
    _blocks_quantize(q, scale, q2, scale2, block=(1, group_size), ue8m0=ue8m0, eps=eps,
                     activation="gelu_tanh" if approximate == "tanh" else "gelu", profile=profile)
    return q2, scale2


def dequant_bias(g, scale_a, scale_b, bias, *, out_dtype, profile):
    """out = fp32(g) * scale_a[m] * scale_b[n] + fp32(bias[n]), evaluated left to right.

    g [M, N] bf16/fp16/fp32/int32, scale_a [M] fp32, scale_b [N] fp32, bias [N] float or None
    -> out [M, N] out_dtype (bf16/fp16/fp32).
    """
    M, N = g.shape
    out = torch.empty((M, N), dtype=out_dtype, device=g.device)
    if g.numel() == 0:
        return out
    bias = _as_kernel_float(bias)
    block_m, block_n, warps = configs.tile_2d(M, N, profile)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    dequant_bias_kernel[grid](
        _view(g), scale_a, scale_b, g if bias is None else _view(bias), _view(out), M, N,
        g.stride(0), scale_a.stride(0), scale_b.stride(0), 0 if bias is None else bias.stride(0),
        out.stride(0), G=_KIND[g.dtype], BIAS="none" if bias is None else _KIND[bias.dtype],
        OUT=_KIND[out_dtype], BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        enable_fp_fusion=False)
    return out


def scaled_mm(a, a_scale, b, b_scale, *, block_n, block_k, bias, activation, out_dtype, out_quant,
              out_group, ue8m0_out, eps, profile):
    """Block-scaled GEMM a @ b^T with a fused epilogue.

    a [M, K] and b [N, K] fp8_e4m3fn or int8 (same), a_scale [M, ceil(K/Bk)] fp32 and
    b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (any strides), bias [N] float or None, activation
    None/"gelu"/"gelu_tanh"/"silu". Returns out [M, N] out_dtype (bf16/fp16/fp32) when out_quant is
    None, else (q [M, N] out_quant, scale [M, ceil(N/out_group)] fp32) re-quantized per 1×out_group.
    FP8 runs on FP8 tensor cores when `profile.fp8_mma`, else decoded to fp16 (exact).
    block_k must be a power of two >= 16 (it is the K tile); out_group a power of two.
    """
    M, K = a.shape
    N = b.shape[0]
    qfmt = _KIND[a.dtype]
    use_fp8_mma = qfmt == "fp8" and bool(profile.fp8_mma)
    if out_quant is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
        out_scale, result = out, out
    else:
        out = torch.empty((M, N), dtype=out_quant, device=a.device)
        out_scale = torch.empty((M, triton.cdiv(N, out_group)), dtype=torch.float32, device=a.device)
        result = (out, out_scale)
    if out.numel() == 0:
        return result
    bias = _as_kernel_float(bias)
    out_kind = _KIND[out.dtype]
    constants = dict(
        QFMT=qfmt, USE_FP8_MMA=use_fp8_mma, SCALE_BN=block_n,
        BIAS="none" if bias is None else _KIND[bias.dtype], ACTIVATION=activation or "none",
        OUT=out_kind, OUT_GROUP=out_group if out_quant is not None else 1, UE8M0_OUT=bool(ue8m0_out),
        HW_FP8=_hw_fp8(profile),
        BLOCK_K=block_k, GROUP_M=_GROUP_M)

    def run(cfg: configs.GemmConfig):
        grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
        tma = cfg.tma and _tma_ready(a, b, profile)
        a_desc = TensorDescriptor.from_tensor(a, [cfg.block_m, block_k]) if tma else None
        b_desc = TensorDescriptor.from_tensor(b, [cfg.block_n, block_k]) if tma else None
        block_scaled_mm_kernel[grid](
            _view(a), _view(b), a_desc, b_desc, a_scale, b_scale, out if bias is None else _view(bias),
            _view(out), out_scale, M, N, K, a.stride(0), b.stride(0), a_scale.stride(0), a_scale.stride(1),
            b_scale.stride(0), b_scale.stride(1), 0 if bias is None else bias.stride(0),
            out.stride(0), out_scale.stride(0), eps, **constants, TMA=tma,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, K_STEP=cfg.k_step, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)

    def bench(cfg: configs.GemmConfig) -> float:
        return triton.testing.do_bench(lambda: run(cfg))

    cfg = configs.gemm_config(
        profile, M, N, K, block_k=block_k, min_block_n=out_group if out_quant is not None else 1,
        mma="fp8" if use_fp8_mma else ("int8" if qfmt == "int8" else "fp16"),
        variant=(out_kind, activation), bench=bench)
    run(cfg)
    return result


def _hw_fp8(profile) -> bool:
    """FP8 conversion instructions exist (sm_89+, the GPUs with FP8 MMA); the interpreter's cast
    mis-rounds, so it keeps the integer codec even when it runs a simulated GPU's paths."""
    return profile.kind == "cuda" and bool(profile.fp8_mma) and not capability.triton_interpreter()


def _tma_ready(a, b, profile) -> bool:
    """Whether a and b can be read through TMA descriptors: a Hopper-class device (a simulated
    older GPU gets its own path) and 16-byte aligned bases and row strides (TMA's rules)."""
    return (TensorDescriptor is not None and profile.kind == "cuda"
            and tuple(profile.compute_capability or (0, 0)) >= (9, 0)
            and all(t.data_ptr() % 16 == 0 and t.stride(0) % 16 == 0 for t in (a, b)))


def _as_kernel_float(bias):
    """Bias as a kernel reads it: fp32/fp16/bf16 as is, any other float dtype rounded to fp32."""
    if bias is None or bias.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return bias
    return bias.float()
