"""quantcore's public ops. Each validates its arguments (raising `InvalidInputError`), picks an
implementation through the registry and launches it; the validated plan is kept per argument
signature (`dispatch.py`), so repeated calls with same-shaped inputs skip straight to the launch.

`backend=None` (or "auto") chooses automatically; a name ("triton", "cupy", "torch") forces that
backend and raises `UnsupportedError` with its reasons when it cannot run; a sequence of names sets
the priority for this call. Scales are dequantization multipliers: x ≈ q * scale. The ops are
inference-only: their outputs never require grad, whatever the backend and the inputs.
"""

from __future__ import annotations

import torch

from . import registry, specs
from .dispatch import call
from .formats import DEFAULT_BLOCK, DEFAULT_EPS, DEFAULT_GROUP
from .registry import BackendChoice, Explanation


def act_quant(x: torch.Tensor, *, dtype=torch.float8_e4m3fn, group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32",
              eps: float = DEFAULT_EPS, scale_layout: str = "row", check_finite: bool = False,
              backend: BackendChoice = None):
    """Quantize activations per 1×`group_size` group along the last dim.

    x: [..., K] bf16/fp16/fp32. dtype: torch.float8_e4m3fn, torch.int8 or "auto".
    scale_fmt: "fp32" or "ue8m0" (scales rounded up to powers of two). scale_layout: "row" (contiguous
    [..., KB]) or "m_major" (the rows dimension fastest, as cuBLAS/DeepGEMM want).
    Returns (q [..., K] dtype, scale [..., ceil(K/group_size)] fp32). A block with NaN/Inf gets a
    non-finite scale (or raises `NonFiniteInputError` with check_finite=True); other blocks are unaffected.
    """
    return call("act_quant", (x,), dict(dtype=dtype, group_size=group_size, scale_fmt=scale_fmt, eps=eps,
                                        scale_layout=scale_layout, check_finite=check_finite), backend)


def act_dequant(q: torch.Tensor, scale: torch.Tensor, *, group_size: int = DEFAULT_GROUP,
                out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """Dequantize activations: q [..., K] (fp8/int8), scale [..., ceil(K/G)] fp32 (any layout) -> [..., K] out_dtype."""
    return call("act_dequant", (q, scale), dict(group_size=group_size, out_dtype=out_dtype), backend)


def weight_quant(w: torch.Tensor, *, dtype=torch.float8_e4m3fn, block_size: tuple[int, int] = DEFAULT_BLOCK,
                 scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, check_finite: bool = False,
                 backend: BackendChoice = None):
    """Quantize a weight per Bn×Bk block: w [N, K] bf16/fp16/fp32 -> (q [N, K] dtype,
    scale [ceil(N/Bn), ceil(K/Bk)] fp32), the DeepSeek-V3 `weight_scale_inv` layout."""
    return call("weight_quant", (w,), dict(dtype=dtype, block_size=block_size, scale_fmt=scale_fmt, eps=eps,
                                           check_finite=check_finite), backend)


def weight_dequant(q: torch.Tensor, scale: torch.Tensor, *, block_size: tuple[int, int] = DEFAULT_BLOCK,
                   out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """Dequantize a block-quantized weight: q [N, K], scale [ceil(N/Bn), ceil(K/Bk)] fp32 -> [N, K] out_dtype."""
    return call("weight_dequant", (q, scale), dict(block_size=block_size, out_dtype=out_dtype), backend)


def scaled_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, *,
              bias: torch.Tensor | None = None, activation: str | None = None, out_dtype: torch.dtype = torch.bfloat16,
              out_quant=None, block_size: tuple[int, int] = DEFAULT_BLOCK, out_group_size: int = DEFAULT_GROUP,
              out_scale_fmt: str = "fp32", eps: float = DEFAULT_EPS, backend: BackendChoice = None):
    """Block-scaled GEMM `a[..., K] @ b[N, K]^T` with FP8 or INT8 operands and a fused epilogue.

    a: [..., K] fp8/int8 with a_scale [..., ceil(K/Bk)] fp32 (act_quant with group_size=Bk);
    b: [N, K] same dtype with b_scale [ceil(N/Bn), ceil(K/Bk)] fp32 (weight_quant with block_size).
    Per K block the dot is accumulated in fp32 (FP8) or exactly in int32 (INT8), then scaled into fp32.
    Epilogue: + bias [N], activation (None, "gelu", "gelu_tanh", "silu"), then a cast to out_dtype
    (returns [..., N]) or, with out_quant a quantized dtype, re-quantization per 1×out_group_size
    (returns (q [..., N], scale [..., ceil(N/out_group_size)])).
    """
    return call("scaled_mm", (a, a_scale, b, b_scale, bias),
                dict(activation=activation, out_dtype=out_dtype, out_quant=out_quant, block_size=block_size,
                     out_group_size=out_group_size, out_scale_fmt=out_scale_fmt, eps=eps), backend)


def quant_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
                 activation: str | None = None, out_dtype: torch.dtype = torch.bfloat16,
                 block_size: tuple[int, int] = DEFAULT_BLOCK, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                 backend: BackendChoice = None) -> torch.Tensor:
    """A quantized linear layer in one call: `act_quant(x, dtype=w.dtype, group_size=Bk, scale_fmt, eps)`
    followed by `scaled_mm(..., w, w_scale, bias=bias, activation=activation, out_dtype=out_dtype,
    block_size=block_size)`, bit for bit, on the same backend.

    x: [..., K] bf16/fp16/fp32; w: [N, K] fp8_e4m3fn/int8 with w_scale [ceil(N/Bn), ceil(K/Bk)] fp32
    (weight_quant's output); bias: [N] or None. Returns [..., N] out_dtype. Where the GEMM runs its
    decode kernel (Triton, M <= 64 rows) the activation is quantized in the kernel's prologue: one
    launch instead of two.
    """
    return call("quant_linear", (x, w, w_scale, bias),
                dict(activation=activation, out_dtype=out_dtype, block_size=block_size, scale_fmt=scale_fmt, eps=eps),
                backend)


def dequant_bias(g: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, bias: torch.Tensor | None = None, *,
                 out_dtype: torch.dtype = torch.bfloat16, backend: BackendChoice = None) -> torch.Tensor:
    """The epilogue after an INT8/FP8 GEMM with per-row and per-column scales:
    out = g · scale_a[m] · scale_b[n] + bias[n], in fp32, cast to out_dtype.

    g: [..., N] bf16/fp16/fp32/int32 (e.g. `torch._int_mm`'s output); scale_a: [...] or [..., 1] fp32;
    scale_b: [N] or [1, N] fp32; bias: [N] or [1, N] float. Returns [..., N] out_dtype.
    """
    return call("dequant_bias", (g, scale_a, scale_b, bias), dict(out_dtype=out_dtype), backend)


def quantized_gelu(q: torch.Tensor, scale: torch.Tensor, *, group_size: int = DEFAULT_GROUP, approximate: str = "none",
                   out_dtype=None, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                   backend: BackendChoice = None):
    """GELU on quantized activations: dequantize, GELU ("none": erf, "tanh") in fp32, re-quantize per group.

    q: [..., K] fp8/int8; scale: [..., ceil(K/G)] fp32. out_dtype: the output's quantized dtype
    (None keeps q's). Returns (q [..., K], scale [..., ceil(K/G)] fp32).
    """
    return call("quantized_gelu", (q, scale), dict(group_size=group_size, approximate=approximate,
                                                   out_dtype=out_dtype, scale_fmt=scale_fmt, eps=eps), backend)


def explain(op: str, *args, backend: BackendChoice = None, **kwargs) -> Explanation:
    """Which implementation `quantcore.ops.<op>(*args, **kwargs)` would run here, and why each other
    implementation was not chosen. Prints readably; `.model_dump()` gives the data."""
    if op not in specs.SPECS:
        raise specs.checks.fail("explain", f"unknown op {op!r}; expected one of {sorted(specs.SPECS)}")
    return registry.explain_query(specs.SPECS[op](*args, **kwargs).query, backend)
