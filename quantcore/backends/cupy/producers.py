"""The fused producers' launch functions (docs/backend-contract.md) on `kernels/producers.cu`: one thread
block per row for `rms_norm_quant`, the block quantizer's grid for `silu_mul_quant`. Prepared as the
launches of `launch.py` are: the plan fixes the instantiation, grid and constant arguments, and a call
allocates the outputs and launches once."""

from __future__ import annotations

import math

import torch

from ...runtime.launch import allocator, by_address, prepared, quantized_outputs
from .launch import (_CTYPE, _QTYPE, _QUANT_THREADS, _kernel, _nothing, _quantizer, _row_stride, _run, _team,
                     _vector_width)
from .launcher import POINTER, f32, i32, i64


def norm_passes(H: int, vec: int) -> int:
    """How many row chunks of kQuantThreads × vec elements each thread of the norm's block sums: enough to
    cover the row padded to a power of two (the contract's tree), itself a power of two."""
    return max(1, (1 << max(H - 1, 0).bit_length()) // (_QUANT_THREADS * vec))


# Values a thread keeps in registers from the sum to the quantization (`group_lanes`); past it, spills.
_KEPT_FLOATS = 64


def group_lanes(H: int, group_size: int, vec: int) -> int:
    """How many neighbouring threads' chunks of `vec` make one group, where the norm quantizes from the registers
    its sum read: a power of two within a warp, and the row's chunks few enough to keep (`_KEPT_FLOATS`); else
    0, and the block quantizer reads the row again."""
    lanes = group_size // vec
    fits = norm_passes(H, vec) * vec <= _KEPT_FLOATS
    return lanes if group_size % vec == 0 and lanes & (lanes - 1) == 0 and lanes <= 32 and fits else 0


def rms_norm_kernel_name(x_dtype, w_dtype, qdtype, vec: int, passes: int, residual: bool, lanes: int, qvec: int,
                         team: int, cache: int) -> str:
    """The producers.cu instantiation of the norm for these dtypes and widths (its output rounded to the
    promoted dtype of x and the weight, as the unfused product is)."""
    out = _CTYPE[torch.promote_types(x_dtype, w_dtype)]
    return (f"qc::rms_norm_quant_kernel<{_CTYPE[x_dtype]}, {_CTYPE[w_dtype]}, {out}, {_QTYPE[qdtype]}, {vec}, "
            f"{passes}, {'true' if residual else 'false'}, {lanes}, {qvec}, {team}, {cache}>")


@prepared
def rms_norm_quant(x, weight, residual, *, eps, qdtype, group_size, ue8m0, quant_eps, scale_m_major, profile):
    """The contract's `rms_norm_quant` (docs/backend-contract.md) in one launch of `rms_norm_kernel_name`'s
    instantiation, a block per row: its groups quantized from the registers the sum read where they fit
    (`group_lanes`), else by the block quantizer reading the row again."""
    (M, H), device = x.shape, x.device
    outputs = quantized_outputs(M, H, group_size, qdtype, scale_m_major, device)
    if residual is not None:
        outputs["_residual"] = allocator((M, H), x.dtype, device)
    launch = _nothing
    if M:
        kb = math.ceil(H / group_size)
        tensors = (x, weight) if residual is None else (x, weight, residual)
        strides = (_row_stride(x),) if residual is None else (_row_stride(x), _row_stride(residual))
        limit = 16 // x.element_size()
        vec = _vector_width(limit, (H, *strides), tensors)
        lanes = group_lanes(H, group_size, vec)
        # The block quantizer's widths; unused (1, 1, 1: one instantiation) where the groups are lanes'.
        qvec = 1 if lanes else _vector_width(limit, (H, group_size, *strides), tensors)
        team, cache = (1, 1) if lanes else _team(math.ceil(group_size / qvec), qvec)
        name = rms_norm_kernel_name(x.dtype, weight.dtype, qdtype, vec, norm_passes(H, vec), residual is not None,
                                    lanes, qvec, team, cache)
        launch = _kernel("producers.cu", name, profile, device, (M,), (_QUANT_THREADS,), (
            POINTER, i64(strides[0]), POINTER, POINTER, i64(strides[-1] if residual is not None else 0), POINTER,
            POINTER, i64(1 if scale_m_major else kb), i64(M if scale_m_major else 1), POINTER, i32(H),
            i32(group_size), f32(eps), f32(quant_eps), i32(bool(ue8m0))))
    result = ", ".join(outputs)
    residuals = ("residual", "_residual") if residual is not None else (None, None)
    return by_address(_run("x, weight, residual=None", outputs, launch,
                           ("x", "weight", residuals[0], "_q", "_scale", residuals[1]), None, result))


@prepared
def silu_mul_quant(gate_up, masked_m, *, qdtype, group_size, ue8m0, eps, scale_m_major, profile):
    """The contract's `silu_mul_quant` (docs/backend-contract.md) in one launch of the block quantizer's
    kernel (`_quantizer`) over [M, I], reading gate and up where it reads its input; with masked_m, rows past
    an expert's count are neither read nor written."""
    (M, width), device = gate_up.shape, gate_up.device
    I = width // 2
    kb = math.ceil(I / group_size)
    outputs = quantized_outputs(M, I, group_size, qdtype, scale_m_major, device)
    launch = _nothing
    if M:
        ld = _row_stride(gate_up)
        vec = _vector_width(16 // gate_up.element_size(), (I, ld, group_size), (gate_up,))
        rows_per_expert = 1 if masked_m is None else M // masked_m.shape[0]
        launch = _quantizer("producers.cu", f"qc::silu_mul_quant_kernel<{_CTYPE[gate_up.dtype]}, {_QTYPE[qdtype]}",
                            (POINTER, i64(ld), POINTER, i32(rows_per_expert)),
                            (i32(M), i32(I), i32(1), i32(group_size), f32(eps), i32(bool(ue8m0))), (M, I),
                            (1, M) if scale_m_major else (kb, 1), (1, group_size), vec, profile, device)
    return by_address(_run("gate_up, masked_m=None", outputs, launch,
                           ("gate_up", None if masked_m is None else "masked_m", "_q", "_scale"), None, "_q, _scale"))
