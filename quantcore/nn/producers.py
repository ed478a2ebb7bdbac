"""Modules that produce quantized activations for the `QuantLinear`s they feed, so that a Llama-style block
quantizes each activation once, in the kernel that computes it, instead of writing it in bf16 for every
linear to read and quantize again:

- `QuantRMSNorm`: RMSNorm (with vLLM's fused residual add) and act_quant in one `rms_norm_quant` call;
- `QuantSiLUMul`: SiLU-and-multiply of a fused gate_up projection and act_quant in one `silu_mul_quant`;
- `QuantizedActivation`: what both return, (q, scale) and the float dtype it stands for, which
  `QuantLinear` takes in place of a float input (`scaled_mm` on the pair, bit for bit the layer on the float
  activation: docs/numerics.md, "Fused producers").

A producer's format must be its consumers': their weights' dtype (FP8 or INT8), their K block as its group
size, their activation scale format. `quantize_model(..., fuse_norms=..., fuse_silu_mul=...)` builds them so;
built by hand, `QuantLinear` refuses a pair of another dtype or group count.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

from .. import ops
from ..definitions import checks
from ..definitions.producers import DEFAULT_NORM_EPS
from ..errors import InvalidInputError
from ..formats import DEFAULT_GROUP, SCALE_LAYOUTS, dtype_name, format_named


class QuantizedActivation(NamedTuple):
    """An activation quantized per 1×G group along its last dim, as a fused producer returns it and
    `QuantLinear` takes it. q: [..., K] float8_e4m3fn/int8; scale: [..., ceil(K/G)] fp32 (either layout);
    dtype: the float dtype of the activation it stands for (a QuantLinear without its own out_dtype returns
    that dtype, as it does for the float input)."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype = torch.bfloat16


def _format(owner: str, dtype: Any, device: torch.device | str | None) -> torch.dtype:
    """The quantized dtype meant by `dtype` on `device` (None: the default device), as `layers.resolve_dtype`
    resolves a QuantLinear's, errors naming `owner`."""
    named = format_named(dtype) if isinstance(dtype, str) else None
    where = torch.device(torch.get_default_device() if device is None else device)
    return checks.quant_format(owner, "dtype", named.dtype if named else dtype, where).dtype


class QuantRMSNorm(nn.Module):
    """RMSNorm quantized for the QuantLinears it feeds: `weight * x / sqrt(mean(x²) + eps)` as Llama's
    RMSNorm rounds it, quantized per 1×group_size (`quantcore.ops.rms_norm_quant`).

    hidden_size H; eps: the norm's (None: torch.finfo of the input's dtype, as nn.RMSNorm's default);
    dtype: the consumers' weight format ("auto", "fp8", "int8", a torch dtype: see `resolve_dtype`);
    group_size: their K block; scale_fmt: their activation scale format; scale_layout: "row" or "m_major".
    Parameter `weight` [H] (fp32 unless loaded or cast; frozen: the op has no gradient). forward(x [..., H]
    bf16/fp16/fp32, residual=None) -> QuantizedActivation, or with a residual [..., H] of x's dtype
    (QuantizedActivation of x + residual normalized, x + residual in x's dtype) for the next layer, as
    vLLM's fused_add_rms_norm returns them."""

    def __init__(self, hidden_size: int, eps: float | None = DEFAULT_NORM_EPS, *, dtype: Any = "auto",
                 group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32", scale_layout: str = "row",
                 device: torch.device | str | None = None):
        super().__init__()
        owner = type(self).__name__
        self.hidden_size = checks.positive_int(owner, "hidden_size", hidden_size)
        self.eps = eps
        self.qdtype = _format(owner, dtype, device)
        self.group_size = checks.positive_int(owner, "group_size", group_size)
        checks.scale_fmt(owner, scale_fmt)
        self.scale_fmt = scale_fmt
        self.scale_layout = checks.choice(owner, "scale_layout", scale_layout, SCALE_LAYOUTS)
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device), requires_grad=False)

    @classmethod
    def from_norm(cls, norm: nn.Module, **options: Any) -> QuantRMSNorm:
        """From an RMSNorm: torch's `nn.RMSNorm` (`eps`, `weight` or none) or a Hugging Face one (`weight`
        and `variance_epsilon`), on its device with its weight's dtype; `options` as the constructor's."""
        weight = getattr(norm, "weight", None)
        eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else getattr(norm, "eps", DEFAULT_NORM_EPS)
        shape = getattr(norm, "normalized_shape", None) or (None if weight is None else tuple(weight.shape))
        if shape is None or len(shape) != 1 or (weight is not None and tuple(weight.shape) != tuple(shape)):
            raise InvalidInputError(f"QuantRMSNorm.from_norm: {type(norm).__name__} is not an RMSNorm over the last "
                                    "dim (a 1-D weight, or nn.RMSNorm's normalized_shape of one dim); only those fuse")
        device = None if weight is None else weight.device
        module = cls(shape[0], eps, device=device, **options)
        if weight is not None:
            module.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        return module

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [..., H] -> QuantizedActivation (q [..., H], scale [..., ceil(H/G)], the norm's float dtype); with
        a residual, (that, x + residual [..., H] in x's dtype)."""
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        options = dict(eps=eps, dtype=self.qdtype, group_size=self.group_size, scale_fmt=self.scale_fmt,
                       scale_layout=self.scale_layout)
        weight = self._parameters["weight"]
        if not torch.compiler.is_compiling():
            out = ops.rms_norm_quant(x, weight, residual, **options)
        elif residual is None:
            out = torch.ops.quantcore.rms_norm_quant(x, weight, **options)
        else:
            out = torch.ops.quantcore.rms_norm_quant_residual(x, weight, residual, **options)
        act = QuantizedActivation(out[0], out[1], torch.promote_types(x.dtype, weight.dtype))
        return act if residual is None else (act, out[2])

    def extra_repr(self) -> str:
        return (f"{self.hidden_size}, eps={self.eps}, dtype={dtype_name(self.qdtype)}, group_size={self.group_size}"
                + ("" if self.scale_fmt == "fp32" else f", scale_fmt={self.scale_fmt}"))


class QuantSiLUMul(nn.Module):
    """SiLU-and-multiply of a fused gate_up projection's output, quantized for the QuantLinear it feeds (the
    down projection): `silu(gate) * up` in fp32, quantized per 1×group_size (`quantcore.ops.silu_mul_quant`).

    dtype, group_size, scale_fmt, scale_layout: the consumer's, as `QuantRMSNorm`'s; device: where "auto"
    is resolved. forward(gate_up [..., 2I] bf16/fp16/fp32, masked_m=None) -> QuantizedActivation
    ([..., I]) of gate_up's dtype: the product is fp32, but the activation stands for the model's, so that the
    down projection returns what it returns in a bf16 model. masked_m int32 [E] with gate_up
    [E, max_m, 2I] for MoE decode (rows past an expert's count unspecified)."""

    def __init__(self, *, dtype: Any = "auto", group_size: int = DEFAULT_GROUP, scale_fmt: str = "fp32",
                 scale_layout: str = "row", device: torch.device | str | None = None):
        super().__init__()
        owner = type(self).__name__
        self.qdtype = _format(owner, dtype, device)
        self.group_size = checks.positive_int(owner, "group_size", group_size)
        checks.scale_fmt(owner, scale_fmt)
        self.scale_fmt = scale_fmt
        self.scale_layout = checks.choice(owner, "scale_layout", scale_layout, SCALE_LAYOUTS)

    def forward(self, gate_up: torch.Tensor, masked_m: torch.Tensor | None = None) -> QuantizedActivation:
        options = dict(dtype=self.qdtype, group_size=self.group_size, scale_fmt=self.scale_fmt,
                       scale_layout=self.scale_layout)
        if torch.compiler.is_compiling():
            q, scale = torch.ops.quantcore.silu_mul_quant(gate_up, masked_m, **options)
        else:
            q, scale = ops.silu_mul_quant(gate_up, masked_m, **options)
        return QuantizedActivation(q, scale, gate_up.dtype)

    def extra_repr(self) -> str:
        return (f"dtype={dtype_name(self.qdtype)}, group_size={self.group_size}"
                + ("" if self.scale_fmt == "fp32" else f", scale_fmt={self.scale_fmt}"))
