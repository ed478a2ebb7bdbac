"""The activations of the GEMM epilogue and of quantized GELU, in fp32, evaluated the way every backend
evaluates them (docs/numerics.md), so that they stay accurate over the whole range.

Each is x·g(x) for a gate g rising from 0 to 1: Φ(x) for GELU, sigmoid(2u(x)) for tanh-GELU,
sigmoid(x) for SiLU. Written as 0.5·x·(1 + erf(x/√2)) or with tanh, GELU loses its digits from
x ≈ −3 and cancels to 0 below x ≈ −5.55, where its value is small but far from 0 in fp32. So each is
evaluated through its tail T(s) = s·g(−s), s = |x|: act(x) = x − T(s) for x ≥ 0 and −T(s) below
(g(x) = 1 − g(−x)). T is a product whose exponentially small factor e is applied last, as √e twice,
so that T leaves the normal range only with its own value rather than when e alone does:

    gelu       T(s) = ((0.5·s·erfcx(a))·h)·h          a = s/√2, h = exp(−a²/2)   (= 0.5·s·erfc(s/√2))
    gelu_tanh  T(s) = ((s / (1 + h·h))·h)·h           h = exp(−u), u = √(2/π)·(s + 0.044715·s³)
    silu       T(s) = ((s / (1 + h·h))·h)·h           h = exp(−s/2)

s is capped at 128, where T is 0 in fp32 for all three (an infinite s would give inf·0). erfcx is
`erfcx` below, the one approximation every backend uses (Triton has no erfc or erfcx that its CPU
interpreter runs, and CUDA's erfcxf divides approximately).
"""

from __future__ import annotations

import torch

from ...formats import GELU_TANH_CUBIC, SQRT1_2, SQRT_2_OVER_PI
NO_TAIL = 128.0
# p(q), constant term first: a least-squares fit (float64, Chebyshev nodes) of (1 + 2a)·erfcx(a) − 1
# over q = (a − 2)/(a + 2) in [−1, 1), i.e. a in [0, inf). Triton's and CUDA's kernels spell out the same.
ERFCX_POLY = (0.27697840332984924, -0.09276376664638519, -0.1660310924053192, 0.16404947638511658,
              -0.054211996495723724, -0.008019089698791504, 0.00868928711861372, 0.0012177372118458152,
              -0.0013958703493699431, -0.0003582834324333817, 0.00016087623953353614, 6.351467163767666e-05)


def erfcx(a: torch.Tensor) -> torch.Tensor:
    """erfc(a)·exp(a²) for fp32 a >= 0, within about 3 ulps: (1 + p(q)) / (1 + 2a), p by Horner's rule
    (a multiply, then an add, per coefficient), every operation an fp32 rounding."""
    q = (a - 2) / (a + 2)
    p = torch.full_like(q, ERFCX_POLY[-1])
    for c in reversed(ERFCX_POLY[:-1]):
        p = p * q + c
    return (1 + p) / (1 + 2 * a)


def _tail(s: torch.Tensor, activation: str) -> torch.Tensor:
    s = torch.where(s > NO_TAIL, NO_TAIL, s)  # NaN fails the comparison and stays NaN
    if activation == "gelu":
        a = s * SQRT1_2
        h = torch.exp(-0.5 * (a * a))
        return 0.5 * s * erfcx(a) * h * h
    u = 0.5 * s if activation == "silu" else SQRT_2_OVER_PI * (s + GELU_TANH_CUBIC * (s * s * s))
    h = torch.exp(-u)
    return s / (1 + h * h) * h * h


def activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    """`activation` (None, "gelu", "gelu_tanh", "silu") of an fp32 tensor, in fp32, in the contract's form."""
    if activation is None:
        return x
    t = _tail(x.abs(), activation)
    return torch.where(x >= 0, x - t, -t)
