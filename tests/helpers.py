"""Test helpers: random inputs, shared cases and their judges."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

import oracle
from quantcore import ops
from quantcore.definitions.tolerances import REQUANT_SCALE_RTOL, activation_within, requant_within_one_step

# The Triton interpreter's tests: where there is no GPU, conftest turns the interpreter on before anything
# imports Triton; with a GPU the GPU suite runs the same kernels compiled.
INTERPRETER_ONLY = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                      reason="CPU interpreter tests; the GPU suite runs these kernels on a device")


def randn(shape, dtype=torch.float32, gen=None, scale=1.0, device="cpu"):
    """Random normal values with per-row spread, so blocks get different scales."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    if len(shape) >= 1 and x.numel():
        x = x * torch.exp(torch.randn(*shape[:-1], 1, generator=gen)) * scale
    return x.to(dtype).to(device)


# The ops whose outputs carry a gradient (quant_linear: x and bias; scaled_mm with a float output: bias).
DIFFERENTIABLE = ("scaled_mm", "quant_linear")


def outputs_of_every_op_on_grad_inputs(backend: str) -> dict[str, tuple]:
    """Every op run on `backend` with each float input that it accepts requiring grad (values, scales,
    bias: all but the differentiable ops' codes and scales, which they refuse); the outputs per op, as
    tuples. Small shapes with tails, so the Triton interpreter is quick too; K blocks of 32, the least
    that 8-bit tensor-core MMAs take."""
    gen = torch.Generator().manual_seed(7)
    x = randn((3, 40), gen=gen).requires_grad_()
    w = randn((24, 40), gen=gen).requires_grad_()
    q, s = ops.act_quant(x.detach(), dtype=torch.int8, group_size=32, backend=backend)
    wq, ws = ops.weight_quant(w.detach(), dtype=torch.int8, block_size=(16, 32), backend=backend)
    s_grad, ws_grad = s.clone().requires_grad_(), ws.clone().requires_grad_()
    bias = randn((24,), gen=gen).requires_grad_()
    mm = dict(block_size=(16, 32), bias=bias, activation="gelu", backend=backend)
    out = {
        "act_quant": ops.act_quant(x, dtype=torch.int8, group_size=32, backend=backend),
        "act_dequant": ops.act_dequant(q, s_grad, group_size=32, backend=backend),
        "weight_quant": ops.weight_quant(w, block_size=(16, 32), backend=backend),
        "weight_dequant": ops.weight_dequant(wq, ws_grad, block_size=(16, 32), backend=backend),
        "scaled_mm": ops.scaled_mm(q, s, wq, ws, out_dtype=torch.float32, **mm),
        "scaled_mm+requant": ops.scaled_mm(q, s_grad, wq, ws_grad, out_quant=torch.int8, out_group_size=16, **mm),
        "quant_linear": ops.quant_linear(x, wq, ws, bias, block_size=(16, 32), backend=backend),
        "dequant_bias": ops.dequant_bias(x[:, :24], s_grad[:, 0], bias, bias, backend=backend),
        "quantized_gelu": ops.quantized_gelu(q, s_grad, group_size=32, backend=backend),
    }
    return {op: o if isinstance(o, tuple) else (o,) for op, o in out.items()}


# The epilogue's activations as torch evaluates them, for autograd references.
TORCH_ACTIVATIONS = {None: lambda t: t, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
                     "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}


def reference_quant_linear(x, w, w_scale, bias, activation, block):
    """act(dequant(quant(x)) @ dequant(w)^T + bias) in fp32 with autograd: the quantization straight
    through (its value, the gradient of the identity), the weight dequantized. Returns (y, x', bias')
    with x' and bias' fresh leaves."""
    x = x.detach().clone().requires_grad_()
    bias = None if bias is None else bias.detach().clone().requires_grad_()
    q, s = ops.act_quant(x.detach(), dtype=w.dtype, group_size=block[1])
    xd = ops.act_dequant(q, s, group_size=block[1], out_dtype=torch.float32)
    x_ste = x.float() + (xd - x.float()).detach()
    pre = x_ste @ ops.weight_dequant(w, w_scale, block_size=block, out_dtype=torch.float32).t()
    y = TORCH_ACTIVATIONS[activation](pre if bias is None else pre + bias.float())
    return y, x, bias


def activation_inputs() -> torch.Tensor:
    """fp32 inputs from −20 to 20, dense where 1 + erf(·) cancels (−3 and below) and where a plain
    erfc or exp form would underflow before the product does (about −14.4 … −14.2 and −10.8 … −10.7),
    down to −120 (SiLU's x / (1 + exp(−x)) is −0 below −88.7), with ±0 and tiny values."""
    return torch.cat([torch.linspace(-20, 20, 40001), torch.linspace(-15, -3, 60001), torch.linspace(-120, -20, 2001),
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e-40, -1e-40])])


def check_activation(y: torch.Tensor, x: torch.Tensor, name: str) -> None:
    """`y` = activation `name` of fp32 `x`, within the contract's tolerance of the float64 oracle, and
    with the sign of zero kept for x = ±0."""
    xd = x.double().numpy()
    exact, condition = oracle.activation(xd, name), oracle.activation_condition(xd, name)
    assert activation_within(y, torch.from_numpy(exact), torch.from_numpy(condition)), name
    zeros = x == 0
    assert torch.equal(torch.signbit(y[zeros]), torch.signbit(x[zeros])), name


def tail_gemm_operands(x: torch.Tensor, qdtype, block: int = 16):
    """scaled_mm operands (K = one block×block block) whose fp32 accumulator is exactly 0, in any
    accumulation precision, so that with bias = x the epilogue's activation input is x itself (x: [N]
    fp32; operands on x's device)."""
    a = torch.zeros(2, block, dtype=qdtype, device=x.device)
    b = torch.zeros(x.numel(), block, dtype=qdtype, device=x.device)
    ones = functools.partial(torch.ones, dtype=torch.float32, device=x.device)
    return a, ones(2, 1), b, ones(-(-x.numel() // block), 1)


# The re-quantization floor for tail blocks: their amax lies far below the default 1e-4, which would
# then set their scales and hide the values' errors. 1e-35 / qmax is still a normal fp32 number.
TAIL_EPS = 1e-35


def tail_blocks() -> torch.Tensor:
    """[6, 256] activations whose 1×128 blocks lie in GELU's negative tail, each block's largest |GELU|
    at its least negative value: where the scale comes from values that 1 + erf(·) gets wrong."""
    spans = [(-3, -12), (-5, -20), (-6, -8), (-8, -14), (-12, -14.5), (-14.3, -20)]
    return torch.stack([torch.linspace(lo, hi, 256) for lo, hi in spans])


def judge_quantized_gelu(q, s, q2, s2, approximate, fmt):
    """q2·s2 within one quantization step of the float64 GELU of the dequantized input (oracle);
    CPU tensors, 1×128 groups."""
    K = q.shape[-1]
    x = oracle.f32(oracle.decode(q) * np.repeat(s.double().numpy(), 128, -1)[..., :K])
    exact = torch.from_numpy(oracle.gelu(x, approximate))
    full = torch.from_numpy(np.repeat(s2.double().numpy(), 128, -1)[..., :K])
    assert requant_within_one_step(torch.from_numpy(oracle.decode(q2)) * full, exact, full, fmt)
    assert not s2.isnan().any() and bool((s2 > 0).all())


def same_codes(q: torch.Tensor, expected: torch.Tensor) -> bool:
    """Quantized tensors equal code for code: any NaN code counts as NaN for FP8, and −0 (0x80) is not +0,
    which a comparison of their values would let pass."""
    if q.dtype != expected.dtype or q.shape != expected.shape:
        return False
    if q.dtype == torch.float8_e4m3fn:
        a, b = q.view(torch.uint8), expected.view(torch.uint8)
        nan_a, nan_b = (a & 0x7F) == 0x7F, (b & 0x7F) == 0x7F
        return torch.equal(nan_a, nan_b) and torch.equal(a.masked_fill(nan_a, 0x7F), b.masked_fill(nan_b, 0x7F))
    return torch.equal(q, expected)


def assert_same_q(q: torch.Tensor, expected: torch.Tensor) -> None:
    """`same_codes`, asserted, saying how many codes differ."""
    assert q.dtype == expected.dtype and q.shape == expected.shape
    differ = int((q.view(torch.uint8) != expected.view(torch.uint8)).sum())
    assert same_codes(q, expected), f"{differ} {q.dtype} codes differ (NaN codes of either sign count as equal)"


def assert_same_scale(s: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32 scales equal bit for bit in value (NaN matches NaN, ±Inf matches itself)."""
    assert s.dtype == torch.float32 and s.shape == expected.shape
    assert torch.equal(s.isnan(), expected.isnan())
    assert torch.equal(s.nan_to_num(0, 1, -1), expected.nan_to_num(0, 1, -1)), "scales differ"


def quantizer_scales() -> torch.Tensor:
    """Positive fp32 scales below 2^123, past 2^122, the largest a quantizer makes (fp32's largest amax over
    INT8's qmax, rounded up to a power of two): per exponent (subnormals included) significands 0, all ones, one
    and five random ones; the largest subnormal and a few tiny ones; +Inf and NaN. (Above 2^126 `tl.div_rn`
    itself is off on the H100 under Triton 3.6: −2^126 / 2^127 gave −0.50000006.)"""
    g = torch.Generator().manual_seed(0)
    exps = torch.arange(0, 127 + 123, dtype=torch.int64)
    mants = torch.cat([torch.tensor([0, 0x7FFFFF, 1]), torch.randint(0, 0x800000, (5,), generator=g)])
    bits = (exps[:, None] << 23 | mants[None, :]).flatten()
    bits = torch.cat([bits[bits > 0], torch.tensor([0x7FFFFF, 2, 3, 0x7F800000, 0x7FC00000])])
    return bits.to(torch.int32).view(torch.float32)


def powers_of_two(s: torch.Tensor) -> torch.Tensor:
    """The scales of s that a ue8m0 quantizer makes: normal powers of two, +Inf and NaN."""
    bits = s.view(torch.int32)
    return s[((bits & 0x7FFFFF) == 0) & ((bits >> 23) >= 1) | ~torch.isfinite(s)]


def quantizer_values(s: torch.Tensor, per_scale: int, g: torch.Generator) -> torch.Tensor:
    """`per_scale` values for each scale of s [S] (on s's device, drawn from `g` there) -> [S, per_scale] fp32
    within the quantizers' domain, |x| up to about 448·s: uniform, log-uniform, near FP8's and INT8's
    rounding boundaries nudged by a few ulps, ±0, and ±Inf beside an infinite scale."""
    S, dev = s.shape[0], s.device
    s64 = s.double()[:, None]
    top = torch.where(torch.isfinite(s64), s64 * 448, torch.full_like(s64, 1e30))
    u = torch.rand(S, per_scale, generator=g, device=dev, dtype=torch.float64)
    k = torch.randint(0, 160, (S, per_scale), generator=g, device=dev).double()
    kind = torch.randint(0, 4, (S, per_scale), generator=g, device=dev)
    log_uniform = u * top * torch.exp2(-k)
    # Near (j + 1/2)·s and j·s/8: INT8's ties and FP8's 3-bit significand steps, nudged by a few ulps below.
    j = torch.randint(0, 448 * 8 + 1, (S, per_scale), generator=g, device=dev).double()
    near = torch.where(kind == 2, (torch.floor(j / 8) + 0.5) * s64, j / 8 * s64)
    mag = torch.where(kind == 0, u * top, torch.where(kind == 1, log_uniform, near))
    fmax = torch.finfo(torch.float32).max
    x = mag.clamp(-fmax, fmax).float()
    nudge = torch.randint(-2, 3, (S, per_scale), generator=g, device=dev, dtype=torch.int32)
    # Nudged on the bits, kept from crossing zero or the largest float.
    nudged = (x.view(torch.int32) + nudge).clamp(0, 0x7F7FFFFF).view(torch.float32)
    x = torch.where(kind >= 2, nudged, x)
    sign = torch.randint(0, 2, (S, per_scale), generator=g, device=dev, dtype=torch.bool)
    x = torch.where(sign, -x, x)
    x[:, :2] = torch.tensor([0.0, -0.0], device=dev)
    # Beside an infinite scale (a group holding ±Inf), the infinities themselves.
    inf = torch.isinf(s)
    x[inf, 2], x[inf, 3] = float("inf"), float("-inf")
    return x


def norm_inputs(shape, dtype, w_dtype=None, gen=None, residual=False):
    """x [..., H] with a per-row spread, a weight near 1 and optionally a residual, all seeded."""
    gen = gen or torch.Generator().manual_seed(0)
    x = randn(shape, dtype=dtype, gen=gen, scale=3.0)
    w = (1 + 0.2 * torch.randn(shape[-1], generator=gen)).to(w_dtype or dtype)
    r = randn(shape, dtype=dtype, gen=gen) if residual else None
    return x, w, r


def judge_silu_mul(gate_up, q, s, group, qdtype, ue8m0=False, rows=None):
    """Every value within one quantization step of the float64 silu(gate)·up; fp32 scales within the
    re-quantization tolerance of the exact amax's (ue8m0: the same power of two or its neighbour)."""
    exact = oracle.silu_mul(gate_up).reshape(-1, gate_up.shape[-1] // 2)
    q, s = q.reshape(exact.shape[0], -1), s.reshape(exact.shape[0], -1)
    if rows is not None:
        exact, q, s = exact[rows], q[rows], s[rows]
    full = torch.from_numpy(np.repeat(s.double().numpy(), group, -1)[:, :exact.shape[1]])
    assert requant_within_one_step(torch.from_numpy(oracle.decode(q)) * full, torch.from_numpy(exact), full,
                                   "int8" if qdtype == torch.int8 else "fp8_e4m3")
    blocks = np.pad(np.abs(exact), ((0, 0), (0, -exact.shape[1] % group))).reshape(exact.shape[0], -1, group)
    amax_scale = np.maximum(blocks.max(-1), 1e-4) / oracle.QMAX[qdtype]
    if ue8m0:
        assert bool(((s.double().numpy() >= amax_scale * (1 - REQUANT_SCALE_RTOL))
                     & (s.double().numpy() <= 2 * amax_scale * (1 + REQUANT_SCALE_RTOL))).all())
    else:
        np.testing.assert_allclose(s.double().numpy(), amax_scale, rtol=REQUANT_SCALE_RTOL)


def assert_gemm_rows_agree(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """A grouped GEMM's rows against `scaled_mm`'s of the same rows on the same backend: the same bits, but
    for FP8 on FP8 tensor cores, whose reduced-precision accumulation within a K block depends on the MMA
    instruction the tile size picks (a few rows take mma.sync in the decode kernel, a grouped tile wgmma):
    there the contract's tolerance for that accumulation."""
    from quantcore.definitions.tolerances import gemm_tolerance, rel_error

    assert got.dtype == want.dtype and got.shape == want.shape, what
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[got.element_size()]
    if torch.equal(got.view(view), want.view(view)):
        return
    fp8_mma = got.is_cuda and got.is_floating_point() and got.element_size() > 1 and \
        torch.cuda.get_device_capability(got.device) >= (8, 9)
    assert fp8_mma, f"{what}: {int((got.view(view) != want.view(view)).sum())} elements differ"
    assert rel_error(got, want) <= gemm_tolerance("fp8_e4m3", got.dtype, exact_accumulation=False), what


@pytest.fixture
def whole_k(monkeypatch):
    """scaled_mm with K whole (never split), as the grouped kernels run it: their experts' rows are then
    comparable with scaled_mm's bit for bit. Use with `pytest.mark.usefixtures("whole_k")`."""
    from quantcore import registry
    from quantcore.backends.cupy import launch as cupy_launch
    from quantcore.backends.triton import configs

    monkeypatch.setattr(configs, "_split", lambda profile, tiles, kbs, *args: (1, kbs))
    monkeypatch.setattr(cupy_launch, "gemm_splits", lambda M, N, K, block_k, tile, sms: (-(-K // block_k), 1))
    registry.reset()
    yield
    registry.reset()
