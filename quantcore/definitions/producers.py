"""The fused producers of quantized activations, each defined once: RMSNorm (with the residual add) and
SiLU-and-multiply, each followed by act_quant's 1×G quantization in the same kernel, so that the float
activation a quantized linear reads never goes through memory. Each op's public signature and
docstring, whose body is its spec (validation, normalisation to the backend contract, the selection
query), its launch arguments, custom ops with their fake kernels, and reported formats.

docs/numerics.md ("Fused producers") states what each computes; in short, every backend computes
`act_quant(rms_norm(x))` and `act_quant(silu_mul(gate_up))` of the torch reference's unfused functions
(`backends/torch/producers.py`), bit for bit where the contract is exact.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import capability
from ..formats import DEFAULT_EPS, DEFAULT_GROUP, FLOAT_DTYPES, SCALE_LAYOUTS, dtype_name
from . import checks
from .op import CustomOp, OpDef
from .prepared import Prepared, leading
from .query import BackendChoice, Query, m_bucket
from .quant import quantized_fake, quantized_layout
from .schema import QUANT_FORMATS, example_operands

DEFAULT_NORM_EPS = 1e-6  # Llama's RMSNorm eps (rms_norm_eps in its config)


def _norm_eps(op: str, value) -> float:
    """The norm's eps, added to the mean square before the square root: a number whose fp32 value is positive
    and finite (kernels add it in fp32; an eps that rounds to 0 would make an all-zero row 0 · Inf = NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise checks.fail(op, f"eps (the norm's, added to the mean of squares) must be a finite number > 0, got "
                              f"{value!r}; the quantizer's amax floor is the separate quant_eps")
    with np.errstate(over="ignore", under="ignore"):
        single = np.float32(value)
    if not (np.isfinite(single) and single > 0):
        raise checks.fail(op, f"eps={value!r} is {float(single)!r} in fp32, where the norm adds it; use an eps "
                              f"between {2.0 ** -149:.3g} and {float(np.finfo(np.float32).max):.7g}")
    return float(value)


def rms_norm_quant(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None, *,
                   eps: float = DEFAULT_NORM_EPS, dtype=torch.float8_e4m3fn, group_size: int = DEFAULT_GROUP,
                   scale_fmt: str = "fp32", quant_eps: float = DEFAULT_EPS, scale_layout: str = "row",
                   backend: BackendChoice = None) -> tuple[torch.Tensor, ...]:
    """RMSNorm then act_quant in one pass: Llama's `weight * (x / sqrt(mean(x²) + eps))`, quantized per
    1×`group_size` group along the last dim, with vLLM's fused residual add where `residual` is given.

    x: [..., H] bf16/fp16/fp32; weight: [H] bf16/fp16/fp32; residual: None or [..., H] of x's dtype.
    With a residual the norm reads new_residual = x + residual (rounded to x's dtype, as a bf16 add
    rounds) and returns it for the next layer. eps: the norm's (added to the mean of squares);
    quant_eps: the quantizer's amax floor (act_quant's `eps`). dtype, scale_fmt, scale_layout: as
    act_quant's. Returns (q [..., H] dtype, scale [..., ceil(H/group_size)] fp32), and new_residual
    [..., H] x's dtype after them when a residual is given. Bit for bit `act_quant` of the reference norm
    (docs/numerics.md, "Fused producers"); a NaN in a row makes every group of that row's scale NaN.
    """
    op = "rms_norm_quant"
    x = checks.tensor(op, "x", x, FLOAT_DTYPES)
    lead, H = x.shape[:-1], x.shape[-1]
    weight = checks.tensor(op, "weight", weight, FLOAT_DTYPES)
    if weight.dim() != 1 or weight.shape[0] != H:
        raise checks.fail(op, f"weight has shape {tuple(weight.shape)}; expected ({H},), one value per feature of "
                              f"x's last dim (the RMSNorm's weight for hidden size {H})")
    if residual is not None:
        residual = checks.tensor(op, "residual", residual, FLOAT_DTYPES)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise checks.fail(op, f"residual is {dtype_name(residual.dtype)} of shape {tuple(residual.shape)}; "
                                  f"expected x's dtype and shape, {dtype_name(x.dtype)} {tuple(x.shape)} (the "
                                  "running sum of the layers' outputs that x is added to)")
    checks.same_device(op, x=x, weight=weight, residual=residual)
    norm_eps = _norm_eps(op, eps)
    fmt = checks.quant_format(op, "dtype", dtype, x.device)
    group = checks.positive_int(op, "group_size", group_size)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    floor = checks.eps(op, quant_eps, fmt.qmax, "quant_eps")
    layout = checks.choice(op, "scale_layout", scale_layout, SCALE_LAYOUTS)
    x2 = checks.rows(x)
    profile = capability.profile_for(x.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(group,), m_bucket=m_bucket(x2.shape[0])),
        dict(x=x2, weight=checks.last_dim_contiguous(weight),
             residual=None if residual is None else checks.rows(residual), eps=norm_eps, qdtype=fmt.dtype,
             group_size=checks.within(group, H), ue8m0=ue8m0, quant_eps=floor,
             scale_m_major=layout == "m_major", profile=profile),
        leading(lead), empty=x2.shape[0] == 0,
    )


_RESIDUAL_HINT = ("torch.ops.quantcore.rms_norm_quant returns (q, scale) and takes no residual; "
                  "torch.ops.quantcore.rms_norm_quant_residual takes one and returns (q, scale, new_residual)")


def _rms_norm_quant_fake(x, weight, residual=None, *, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP,
                         scale_layout="row", **_):
    if residual is not None:
        raise checks.fail("rms_norm_quant", _RESIDUAL_HINT)
    return quantized_fake(x, x.shape[:-1], x.shape[-1], "rms_norm_quant", dtype=dtype, group_size=group_size,
                          scale_layout=scale_layout)


def _rms_norm_quant_residual_fake(x, weight, residual=None, **options):
    if residual is None:
        raise checks.fail("rms_norm_quant_residual", _RESIDUAL_HINT)
    return (*_rms_norm_quant_fake(x, weight, **options), x.new_empty(x.shape))


def _outputs(count: int):
    """The layout of a custom op returning `count` tensors, refusing a call whose real outputs number otherwise
    (the residual given to the op without one, or missing from the op with one)."""
    def layout(out, options):
        if len(out) != count:
            raise checks.fail("rms_norm_quant", _RESIDUAL_HINT)
        return quantized_layout(out, options)
    return layout


def _rms_norm_quant_example(fmt, device="cpu", m=2, n=32, k=512):
    """x [m, k] fp32 with a per-row spread and a weight [k] near 1, quantized to `fmt`."""
    x, w, _, (wq, _) = example_operands(fmt, device, m, n, k)
    return (x, 1 + 0.1 * w[0]), dict(dtype=wq.dtype)


# One custom op per return type (as scaled_mm's): with a residual the op also returns the new residual.
RMS_NORM_QUANT = OpDef(
    rms_norm_quant, ("x", "weight", "residual"),
    ("x", "weight", "residual", "eps", "qdtype", "group_size", "ue8m0", "quant_eps", "scale_m_major", "profile"),
    QUANT_FORMATS, (DEFAULT_GROUP,),
    (CustomOp("rms_norm_quant", _rms_norm_quant_fake, _outputs(2), returns=2,
              serves=lambda arguments: arguments["residual"] is None),
     CustomOp("rms_norm_quant_residual", _rms_norm_quant_residual_fake, _outputs(3), returns=3,
              serves=lambda arguments: arguments["residual"] is not None)),
    _rms_norm_quant_example)


def silu_mul_quant(gate_up: torch.Tensor, masked_m: torch.Tensor | None = None, *, dtype=torch.float8_e4m3fn,
                   group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32", eps: float = DEFAULT_EPS,
                   scale_layout: str = "row", backend: BackendChoice = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU-and-multiply then act_quant in one pass: `silu(gate) * up` of a fused gate_up projection's
    output, in fp32, quantized per 1×`group_size` group.

    gate_up: [..., 2I] bf16/fp16/fp32, gate = gate_up[..., :I], up = gate_up[..., I:]. masked_m: None,
    or for MoE decode int32 [E] on gate_up's device with gate_up [E, max_m, 2I]: expert e's rows are
    gate_up[e, :masked_m[e]] (a count is clamped to 0..max_m), and the outputs of the other rows are
    unspecified (the GPU kernels leave them unwritten). dtype, scale_fmt, eps (the amax floor),
    scale_layout: as act_quant's. Returns (q [..., I] dtype, scale [..., ceil(I/group_size)] fp32).
    """
    op = "silu_mul_quant"
    gate_up = checks.tensor(op, "gate_up", gate_up, FLOAT_DTYPES)
    lead, width = gate_up.shape[:-1], gate_up.shape[-1]
    if width % 2:
        raise checks.fail(op, f"gate_up has an odd last dim ({width}, shape {tuple(gate_up.shape)}); expected 2I: the "
                              "gate and up projections' outputs side by side, as a fused gate_up linear gives them")
    if masked_m is not None:
        masked_m = checks.tensor(op, "masked_m", masked_m, (torch.int32,))
        if gate_up.dim() != 3 or masked_m.shape != gate_up.shape[:1]:
            raise checks.fail(op, f"masked_m has shape {tuple(masked_m.shape)} and gate_up {tuple(gate_up.shape)}; "
                                  "with masked_m, gate_up must be [E, max_m, 2I] and masked_m [E] (one row count per "
                                  "expert)")
        checks.same_device(op, gate_up=gate_up, masked_m=masked_m)
        masked_m = checks.last_dim_contiguous(masked_m)
    fmt = checks.quant_format(op, "dtype", dtype, gate_up.device)
    group = checks.positive_int(op, "group_size", group_size)
    ue8m0 = checks.scale_fmt(op, scale_fmt)
    floor = checks.eps(op, eps, fmt.qmax)
    layout = checks.choice(op, "scale_layout", scale_layout, SCALE_LAYOUTS)
    g2 = checks.rows(gate_up)
    profile = capability.profile_for(gate_up.device)
    return Prepared(
        Query(op, profile, fmt.name, blocks=(group,), m_bucket=m_bucket(g2.shape[0])),
        dict(gate_up=g2, masked_m=masked_m, qdtype=fmt.dtype, group_size=checks.within(group, width // 2),
             ue8m0=ue8m0, eps=floor, scale_m_major=layout == "m_major", profile=profile),
        leading(lead), empty=g2.shape[0] == 0,
    )


def _silu_mul_quant_fake(gate_up, masked_m=None, *, dtype=torch.float8_e4m3fn, group_size=DEFAULT_GROUP,
                         scale_layout="row", **_):
    return quantized_fake(gate_up, gate_up.shape[:-1], gate_up.shape[-1] // 2, "silu_mul_quant", dtype=dtype,
                          group_size=group_size, scale_layout=scale_layout)


def _silu_mul_quant_example(fmt, device="cpu", m=2, n=32, k=512):
    """gate_up [m, 2·(k/2)] fp32 with a per-row spread (k even), quantized to `fmt`."""
    x, _, _, (wq, _) = example_operands(fmt, device, m, n, k + k % 2)
    return (x,), dict(dtype=wq.dtype)


SILU_MUL_QUANT = OpDef(
    silu_mul_quant, ("gate_up", "masked_m"),
    ("gate_up", "masked_m", "qdtype", "group_size", "ue8m0", "eps", "scale_m_major", "profile"),
    QUANT_FORMATS, (DEFAULT_GROUP,), (CustomOp("silu_mul_quant", _silu_mul_quant_fake, quantized_layout),),
    _silu_mul_quant_example)
