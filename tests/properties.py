"""Property checks of every op against the independent float64 oracle (tests/oracle.py), for any
backend: each `check_*` draws its case (shapes with tails, block sizes larger than the tensor too,
formats, scale formats, eps, NaN/Inf blocks, activations, dtypes) from hypothesis's `data` and judges
the op's outputs. tests/test_properties.py runs them on the torch backend, the Triton kernel tests on
the interpreter."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st

import oracle
from helpers import assert_same_q, assert_same_scale, randn
from quantcore import ops
from quantcore.definitions.tolerances import (REQUANT_SCALE_RTOL, activation_within, gemm_tolerance,
                                              requant_within_one_step)

FMTS = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}

qdtypes = st.sampled_from(list(FMTS))
float_dtypes = st.sampled_from([torch.bfloat16, torch.float16, torch.float32])
blocks = st.integers(1, 48) | st.just(2**31)  # 2**31: a block larger than any dimension
epsilons = st.sampled_from([1e-4, 1e-12, 1e-37, 0.5])  # 0.5 floors many blocks; 1e-37/qmax is subnormal
activations = st.sampled_from(["gelu", "gelu_tanh", "silu"])


@st.composite
def tensors(draw, rows, cols, dtype=torch.float32):
    """Random values spread over rows and magnitudes, optionally a NaN, an Inf or an all-zero row."""
    shape = (draw(rows), draw(cols))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = randn(shape, gen=gen, scale=10.0 ** draw(st.integers(-6, 6)))
    special = draw(st.sampled_from([None, float("nan"), float("inf"), -float("inf"), 0.0]))
    if special == 0.0:
        x[-1] = 0
    elif special is not None:
        x[draw(st.integers(0, shape[0] - 1)), draw(st.integers(0, shape[1] - 1))] = special
    return x.to(dtype)


def full(scale: torch.Tensor, shape: tuple[int, int], bn: int, bk: int) -> np.ndarray:
    """Per-element scale of a [ceil(N/bn), ceil(K/bk)] block grid, blocks clamped to the shape."""
    bn, bk = min(bn, shape[0]), min(bk, shape[1])
    return np.repeat(np.repeat(scale.double().numpy(), bn, 0), bk, 1)[: shape[0], : shape[1]]


def equal_with_nan(out: torch.Tensor, expected: torch.Tensor) -> bool:
    return torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.nan_to_num(0), expected.nan_to_num(0))


def check_act_quant_and_dequant(data, backend: str) -> None:
    """act_quant bit-exact (codes and scales), act_dequant bit-exact."""
    qdtype, group, ue8m0, eps = (data.draw(qdtypes, label="qdtype"), data.draw(blocks, label="group"),
                                 data.draw(st.booleans(), label="ue8m0"), data.draw(epsilons, label="eps"))
    x = data.draw(tensors(st.integers(1, 5), st.integers(1, 70), data.draw(float_dtypes, label="in_dtype")))
    q, s = ops.act_quant(x, dtype=qdtype, group_size=group, scale_fmt="ue8m0" if ue8m0 else "fp32", eps=eps,
                         backend=backend)
    eq, es = oracle.act_quant(x, qdtype, min(group, x.shape[1]), ue8m0=ue8m0, eps=eps)
    assert_same_q(q, eq)
    assert_same_scale(s, es)
    out_dtype = data.draw(float_dtypes, label="out_dtype")
    y = ops.act_dequant(q, s, group_size=group, out_dtype=out_dtype, backend=backend)
    assert equal_with_nan(y, oracle.dequant(q, full(s, x.shape, 1, group), out_dtype))


def check_weight_quant_and_dequant(data, backend: str) -> None:
    """weight_quant bit-exact (codes and scales), weight_dequant bit-exact."""
    qdtype, bn, bk, ue8m0, eps = (data.draw(qdtypes, label="qdtype"), data.draw(blocks, label="bn"),
                                  data.draw(blocks, label="bk"), data.draw(st.booleans(), label="ue8m0"),
                                  data.draw(epsilons, label="eps"))
    w = data.draw(tensors(st.integers(1, 40), st.integers(1, 40)))
    q, s = ops.weight_quant(w, dtype=qdtype, block_size=(bn, bk), scale_fmt="ue8m0" if ue8m0 else "fp32", eps=eps,
                            backend=backend)
    eq, es = oracle.weight_quant(w, qdtype, min(bn, w.shape[0]), min(bk, w.shape[1]), ue8m0=ue8m0, eps=eps)
    assert_same_q(q, eq)
    assert_same_scale(s, es)
    y = ops.weight_dequant(q, s, block_size=(bn, bk), out_dtype=torch.float32, backend=backend)
    assert equal_with_nan(y, oracle.dequant(q, full(s, w.shape, bn, bk), torch.float32))


def magnitudes(q: torch.Tensor) -> torch.Tensor:
    """|q| in q's quantized dtype (FP8: the sign bit cleared)."""
    return q.abs() if q.dtype == torch.int8 else (q.view(torch.uint8) & 0x7F).view(q.dtype)


def check_scaled_mm(data, backend: str, k_blocks=st.integers(1, 48), out_groups=blocks,
                    mixed_formats: bool = True) -> None:
    """The accumulator (+ bias) against the oracle within the contract's GEMM tolerance, taken relative
    to the result's magnitude without cancellation (tiny shapes draw K blocks that cancel, which fp32
    accumulation cannot follow); the activation against the oracle's, applied to that fp32
    accumulator; the re-quantized output bit-exact against the oracle's quantization of it.
    `k_blocks`, `out_groups`: the sizes the backend tiles; `mixed_formats`: whether it re-quantizes
    into the other format."""
    qdtype = data.draw(qdtypes, label="qdtype")
    bn, bk = data.draw(st.integers(1, 48), label="bn"), data.draw(k_blocks, label="bk")
    M, N, K = (data.draw(st.integers(1, 3), label="M"), data.draw(st.integers(1, 40), label="N"),
               data.draw(st.integers(1, 64), label="K"))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    a, a_s = ops.act_quant(randn((M, K), gen=gen), dtype=qdtype, group_size=bk, backend="torch")
    b, b_s = ops.weight_quant(randn((N, K), gen=gen), dtype=qdtype, block_size=(bn, bk), backend="torch")
    bias = randn((N,), gen=gen) if data.draw(st.booleans(), label="bias") else None
    kw = dict(bias=bias, block_size=(bn, bk), out_dtype=torch.float32, backend=backend)
    y = ops.scaled_mm(a, a_s, b, b_s, **kw)
    exact = torch.from_numpy(oracle.scaled_mm(a, a_s, b, b_s, min(bn, N), bk, bias=bias))
    magnitude = torch.from_numpy(oracle.scaled_mm(magnitudes(a), a_s, magnitudes(b), b_s, min(bn, N), bk,
                                                  bias=None if bias is None else bias.abs()))
    tolerance = gemm_tolerance(FMTS[qdtype], torch.float32)
    assert float((y.double() - exact).norm()) <= tolerance * float(magnitude.norm())
    activation = data.draw(activations, label="activation")
    z = ops.scaled_mm(a, a_s, b, b_s, activation=activation, **kw)
    yd = y.double().numpy()
    assert activation_within(z, torch.from_numpy(oracle.activation(yd, activation)),
                             torch.from_numpy(oracle.activation_condition(yd, activation)))
    out_quant = data.draw(st.sampled_from([None, *FMTS] if mixed_formats else [None, qdtype]), label="out_quant")
    if out_quant is not None:
        group = data.draw(out_groups, label="out_group")
        q, s = ops.scaled_mm(a, a_s, b, b_s, activation=activation, out_quant=out_quant, out_group_size=group, **kw)
        eq, es = oracle.act_quant(z, out_quant, min(group, N))
        assert_same_q(q, eq)
        assert_same_scale(s, es)


def check_dequant_bias(data, backend: str) -> None:
    """dequant_bias bit-exact: fp32 operations left to right, then the cast."""
    g_dtype = data.draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.int32]), label="g_dtype")
    g = data.draw(tensors(st.integers(1, 6), st.integers(1, 40)))
    if g_dtype == torch.int32:
        g = (g * 1000).round().clamp(-2**31, 2**31 - 1).nan_to_num(0).to(torch.int32)
    else:
        g = g.to(g_dtype)
    M, N = g.shape
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    sa, sb = torch.rand(M, generator=gen) + 1e-3, torch.rand(N, generator=gen) + 1e-3
    bias = randn((N,), gen=gen, dtype=torch.bfloat16) if data.draw(st.booleans(), label="bias") else None
    out_dtype = data.draw(float_dtypes, label="out_dtype")
    out = ops.dequant_bias(g, sa, sb, bias, out_dtype=out_dtype, backend=backend)
    assert equal_with_nan(out, oracle.dequant_bias(g, sa, sb, bias).to(out_dtype))


def check_quantized_gelu(data, backend: str) -> None:
    """Every re-quantized value within one quantization step of the float64 GELU of the dequantized
    input (finite inputs: a NaN block's GELU is NaN, which no step bounds)."""
    qdtype, out_qdtype = data.draw(qdtypes, label="qdtype"), data.draw(qdtypes, label="out_qdtype")
    group, ue8m0 = data.draw(blocks, label="group"), data.draw(st.booleans(), label="ue8m0")
    approximate = data.draw(st.sampled_from(["none", "tanh"]), label="approximate")
    x = data.draw(tensors(st.integers(1, 4), st.integers(1, 70))).nan_to_num(0, 0, 0)
    q, s = ops.act_quant(x, dtype=qdtype, group_size=group, backend="torch")
    q2, s2 = ops.quantized_gelu(q, s, group_size=group, approximate=approximate, out_dtype=out_qdtype,
                                scale_fmt="ue8m0" if ue8m0 else "fp32", backend=backend)
    scale_full = torch.from_numpy(full(s2, x.shape, 1, group))
    exact = oracle.gelu(oracle.f32(oracle.decode(q) * full(s, x.shape, 1, group)), approximate)
    got = torch.from_numpy(oracle.decode(q2)) * scale_full
    assert requant_within_one_step(got, torch.from_numpy(exact), scale_full, FMTS[out_qdtype])


def check_rms_norm_quant(data, backend: str) -> None:
    """rms_norm_quant bit-exact (codes, scales and the new residual) against the oracle's norm quantized by
    the oracle, NaN/Inf rows and all-zero rows included."""
    qdtype, group, ue8m0, quant_eps = (data.draw(qdtypes, label="qdtype"), data.draw(blocks, label="group"),
                                       data.draw(st.booleans(), label="ue8m0"), data.draw(epsilons, label="quant_eps"))
    dtype, w_dtype = data.draw(float_dtypes, label="in_dtype"), data.draw(float_dtypes, label="w_dtype")
    eps = data.draw(st.sampled_from([1e-6, 1e-2, 3.0]), label="eps")
    x = data.draw(tensors(st.integers(1, 5), st.integers(1, 70), dtype))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    w = (1 + 0.5 * torch.randn(x.shape[1], generator=gen)).to(w_dtype)
    r = randn(x.shape, gen=gen, dtype=dtype) if data.draw(st.booleans(), label="residual") else None
    got = ops.rms_norm_quant(x, w, r, eps=eps, dtype=qdtype, group_size=group, quant_eps=quant_eps,
                             scale_fmt="ue8m0" if ue8m0 else "fp32", backend=backend)
    y, new_residual = oracle.rms_norm(x, w, r, eps)
    eq, es = oracle.act_quant(torch.from_numpy(y), qdtype, min(group, x.shape[1]), ue8m0=ue8m0, eps=quant_eps)
    assert_same_q(got[0], eq)
    assert_same_scale(got[1], es)
    if r is not None:
        assert equal_with_nan(got[2], new_residual)


def check_silu_mul_quant(data, backend: str) -> None:
    """Every value within one quantization step of the float64 silu(gate)·up (finite inputs); the scales
    within the re-quantization tolerance of the exact amax's."""
    qdtype, group, ue8m0 = (data.draw(qdtypes, label="qdtype"), data.draw(blocks, label="group"),
                            data.draw(st.booleans(), label="ue8m0"))
    dtype = data.draw(float_dtypes, label="in_dtype")
    x = data.draw(tensors(st.integers(1, 4), st.integers(1, 35).map(lambda n: 2 * n), dtype)).nan_to_num(0, 0, 0)
    q, s = ops.silu_mul_quant(x, dtype=qdtype, group_size=group, scale_fmt="ue8m0" if ue8m0 else "fp32",
                              backend=backend)
    group = min(group, x.shape[1] // 2)
    exact = oracle.silu_mul(x)
    scale_full = torch.from_numpy(full(s, exact.shape, 1, group))
    assert requant_within_one_step(torch.from_numpy(oracle.decode(q)) * scale_full, torch.from_numpy(exact),
                                   scale_full, FMTS[qdtype])
    amax = np.pad(np.abs(exact), ((0, 0), (0, -exact.shape[1] % group))).reshape(exact.shape[0], -1, group).max(-1)
    expected = oracle.scales(amax, qdtype, False, 1e-4)
    ratio = s.double().numpy() / expected
    low = ratio >= 1 - REQUANT_SCALE_RTOL
    assert low.all() and (ratio <= (2 if ue8m0 else 1) * (1 + REQUANT_SCALE_RTOL)).all()


CHECKS = {
    "act_quant": check_act_quant_and_dequant,
    "weight_quant": check_weight_quant_and_dequant,
    "scaled_mm": check_scaled_mm,
    "dequant_bias": check_dequant_bias,
    "quantized_gelu": check_quantized_gelu,
    "rms_norm_quant": check_rms_norm_quant,
    "silu_mul_quant": check_silu_mul_quant,
}
