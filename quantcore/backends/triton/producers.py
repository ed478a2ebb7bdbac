"""The fused producers' launch functions (docs/backend-contract.md) on the kernels of `kernels/producers.py`:
`rms_norm_quant`, one program per row, and `silu_mul_quant`, the block quantizer's tiling over [M, I].
Each is `prepared` as the launches of `launch.py` are: the plan fixes tiles, constants and the kernel's
scalar arguments, and a call allocates the outputs and launches once. Both compile without floating-point
contraction: an FMA would round the norm's v·v and the first add of its sum once instead of twice (the
quantizers' FMAs are explicit `tl.fma` calls, which need no contraction)."""

from __future__ import annotations

import torch
import triton

from ...runtime.launch import allocator, by_address, compose, prepared, quantized_outputs
from . import configs
from .direct import Launcher
from .kernels.producers import rms_norm_quant_kernel, silu_mul_quant_kernel
from .kernels.quant import scales_may_be_tiny
from .launch import _KIND, _hw_fp8


@prepared
def rms_norm_quant(x, weight, residual, *, eps, qdtype, group_size, ue8m0, quant_eps, scale_m_major, profile):
    """The contract's `rms_norm_quant` (docs/backend-contract.md) in one launch: a program per row, the row
    held as groups of the block quantizer's tile."""
    (M, H), device = x.shape, x.device
    outputs = quantized_outputs(M, H, group_size, qdtype, scale_m_major, device)
    if residual is not None:
        outputs["_residual"] = allocator((M, H), x.dtype, device)
    params, result = "x, weight, residual=None", ", ".join(outputs)
    if M == 0:
        return by_address(compose(params, outputs, "", {}, result))
    scale = outputs["_scale"]()
    groups, g_pad = triton.cdiv(H, group_size), triton.next_power_of_2(group_size)
    ng_pad = triton.next_power_of_2(groups)
    # The group tile, flattened, is the zero-padded row where groups are powers of two or the row one group.
    tile_sum = g_pad == group_size or groups == 1
    flat = triton.next_power_of_2(H)
    width = ng_pad * g_pad if tile_sum else flat
    out_kind = _KIND[torch.promote_types(x.dtype, weight.dtype)]
    launch = Launcher(rms_norm_quant_kernel, (M, 1), dict(
        GROUP=group_size, NG_PAD=ng_pad, G_PAD=g_pad, FLAT=flat, LEVELS=width.bit_length() - 1, TILE_SUM=tile_sum,
        SRC=_KIND[x.dtype], WKIND=_KIND[weight.dtype], OUT=out_kind, RESIDUAL=residual is not None,
        QFMT=_KIND[qdtype], UE8M0=bool(ue8m0), HW_FP8=_hw_fp8(profile),
        TINY_SCALES=scales_may_be_tiny(quant_eps, qdtype),
        EVEN=H == ng_pad * g_pad and g_pad == group_size, num_warps=configs.row_warps(max(width, flat), profile),
        enable_fp_fusion=False),
        device, fixed=(M, H, x.stride(0), 0 if residual is None else residual.stride(0), H, H, scale.stride(0),
                       scale.stride(1), eps, quant_eps))
    leading = ("x", "weight", None if residual is None else "residual", "_q", "_scale",
               None if residual is None else "_residual")
    return by_address(launch.function(params, leading, outputs, result))


@prepared
def silu_mul_quant(gate_up, masked_m, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    """The contract's `silu_mul_quant` (docs/backend-contract.md) in one launch on the block quantizer's
    tiling of [M, I] (`configs.block_tiling`); with masked_m, rows past an expert's count are neither read
    nor written."""
    (M, width), device = gate_up.shape, gate_up.device
    I = width // 2
    outputs = quantized_outputs(M, I, group_size, qdtype, scale_m_major, device)
    params = "gate_up, masked_m=None"
    if M == 0:
        return by_address(compose(params, outputs, "", {}, "_q, _scale"))
    scale = outputs["_scale"]()
    t = configs.block_tiling(M, I, 1, group_size, profile)
    launch = Launcher(silu_mul_quant_kernel, t.grid, dict(
        BC=group_size, RB=t.rb, CB=t.cb, BC_PAD=t.bc_pad, SRC=_KIND[gate_up.dtype], QFMT=_KIND[qdtype],
        UE8M0=bool(ue8m0), HW_FP8=_hw_fp8(profile), EVEN=t.even, MASKED=masked_m is not None,
        TINY_SCALES=scales_may_be_tiny(eps, qdtype),
        num_warps=t.num_warps, enable_fp_fusion=False), device,
        fixed=(M, I, 1 if masked_m is None else M // masked_m.shape[0], gate_up.stride(0), I, scale.stride(0),
               scale.stride(1), eps))
    leading = ("gate_up", None if masked_m is None else "masked_m", "_q", "_scale")
    return by_address(launch.function(params, leading, outputs, "_q, _scale"))
