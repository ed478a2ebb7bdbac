"""Backward formulas of the differentiable ops: `quant_linear` (gradients for x and bias) and
`scaled_mm` with a float output (a gradient for bias).

The forward quantizes; its derivative is taken straight through the activation quantization
(d dequant(quant(x)) / dx = 1) and through the weight as dequantized, so that for
y = act(dequant(quant(x)) @ dequant(W)^T + bias):

    g      = grad_y · act'(pre)            pre = the same op without activation, recomputed in fp32
    grad_x = g @ dequant(W)                in x's dtype, W dequantized to x's dtype (F.linear's backward)
    grad_b = Σ_rows g                      in fp32, cast to bias's dtype

act' is evaluated in fp32 in closed form. The quantized codes and their scales (W, w_scale; a,
a_scale, b, b_scale of `scaled_mm`) have no gradient: the custom op refuses them in the forward when
they require grad. Everything here calls torch and `torch.ops.quantcore` only, so that
`torch.compile` and AOTAutograd trace the backward like the forward.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..formats import GELU_TANH_CUBIC, SQRT1_2, SQRT_2_OVER_PI

_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def activation_grad(pre: torch.Tensor, activation: str) -> torch.Tensor:
    """d act(pre) / d pre for fp32 `pre`: "gelu" Φ(x) + x·φ(x); "gelu_tanh" s + x·2s(1−s)·u'(x) with
    s = sigmoid(2u), u = √(2/π)(x + 0.044715x³); "silu" s·(1 + x(1−s)) with s = sigmoid(x). Within
    about 1e-6 of the exact derivative (whose magnitude is at most 1.13)."""
    if activation == "gelu":
        return 0.5 * torch.special.erfc(-pre * SQRT1_2) + pre * torch.exp(-0.5 * pre * pre) * _INV_SQRT_2PI
    # 1 − sigmoid(t) as sigmoid(−t): the difference would lose its digits where sigmoid(t) nears 1.
    if activation == "gelu_tanh":
        t = 2 * SQRT_2_OVER_PI * (pre + GELU_TANH_CUBIC * pre * pre * pre)
        du = SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_CUBIC * pre * pre)
        return torch.sigmoid(t) + pre * (2 * torch.sigmoid(t) * torch.sigmoid(-t)) * du
    return torch.sigmoid(pre) * (1 + pre * torch.sigmoid(-pre))


def _pre_activation_grad(grad: torch.Tensor, activation: str | None,
                         pre: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The output's gradient taken back through the epilogue's activation, in fp32."""
    g = grad.float()
    return g if activation is None else g * activation_grad(pre(), activation)


def _bias_grad(g: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return g.reshape(-1, g.shape[-1]).sum(0).to(bias.dtype)


def _backend_family(backend: str | None) -> str | None:
    """The schema's backend argument for an op with no variants (weight_dequant): "torch[cublas]"
    names the reference backend's cuBLAS GEMM, which is the reference backend for other ops."""
    if backend is None:
        return None
    return ",".join(part.partition("[")[0] for part in backend.split(","))


def quant_linear(tensors: dict, options: dict, grad: torch.Tensor, needs: set[str]) -> dict[str, torch.Tensor]:
    """Gradients of `quant_linear` for x [..., K] (in x's dtype) and bias [N] (in bias's dtype)."""
    x, w, w_scale, bias = tensors["x"], tensors["w"], tensors["w_scale"], tensors["bias"]
    qc = torch.ops.quantcore
    g = _pre_activation_grad(grad, options["activation"], lambda: qc.quant_linear(
        x, w, w_scale, bias, **{**options, "activation": None, "out_dtype": torch.float32}))
    out = {}
    if "x" in needs:
        weight = qc.weight_dequant(w, w_scale, block_size=options["block_size"], out_dtype=x.dtype,
                                   backend=_backend_family(options["backend"]))
        out["x"] = torch.matmul(g.to(x.dtype), weight)
    if "bias" in needs:
        out["bias"] = _bias_grad(g, bias)
    return out


def scaled_mm(tensors: dict, options: dict, grad: torch.Tensor, needs: set[str]) -> dict[str, torch.Tensor]:
    """Gradient of `scaled_mm` (float output) for bias [N], in bias's dtype."""
    if "bias" not in needs:
        return {}
    a, a_scale, b, b_scale, bias = (tensors[n] for n in ("a", "a_scale", "b", "b_scale", "bias"))
    g = _pre_activation_grad(grad, options["activation"], lambda: torch.ops.quantcore.scaled_mm(
        a, a_scale, b, b_scale, bias, **{**options, "activation": None, "out_dtype": torch.float32}))
    return {"bias": _bias_grad(g, bias)}
