"""The torch reference's GEMM and epilogues against the float64 oracle, within DESIGN.md's tolerances."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oracle
from helpers import randn
from quantcore import ops
from quantcore.definitions.tolerances import REQUANT_SCALE_RTOL, gemm_tolerance, rel_error, requant_within_one_step

FMTS = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}


def operands(M, N, K, qdtype, gen, block=(128, 128), lead=()):
    x = randn((*lead, M, K), gen=gen)
    w = randn((N, K), gen=gen)
    a, a_s = ops.act_quant(x, dtype=qdtype, group_size=block[1], backend="torch")
    b, b_s = ops.weight_quant(w, dtype=qdtype, block_size=block, backend="torch")
    return a, a_s, b, b_s


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (3, 129, 64), (7, 200, 127), (5, 128, 129), (4, 300, 576),
                                   (2, 64, 1000)])
def test_scaled_mm_fp32_out_matches_float64(gen, qdtype, M, N, K):
    a, a_s, b, b_s = operands(M, N, K, qdtype, gen)
    out = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="torch")
    expected = oracle.scaled_mm(a, a_s, b, b_s, 128, 128)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert rel_error(out, torch.from_numpy(expected)) <= gemm_tolerance(FMTS[qdtype], torch.float32)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_scaled_mm_epilogues(gen, qdtype, activation, out_dtype):
    a, a_s, b, b_s = operands(6, 200, 300, qdtype, gen, lead=(2,))
    bias = randn((200,), gen=gen, dtype=torch.bfloat16)
    out = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, out_dtype=out_dtype, backend="torch")
    assert out.shape == (2, 6, 200) and out.dtype == out_dtype
    expected = oracle.scaled_mm(a, a_s, b, b_s, 128, 128, bias=bias, act=activation).reshape(2, 6, 200)
    assert rel_error(out, torch.from_numpy(expected)) <= gemm_tolerance(FMTS[qdtype], out_dtype)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("out_quant", list(FMTS))
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_requantized_output(gen, qdtype, out_quant, with_bias):
    a, a_s, b, b_s = operands(5, 300, 256, qdtype, gen)
    bias = randn((300,), gen=gen) if with_bias else None
    q, s = ops.scaled_mm(a, a_s, b, b_s, bias=bias, out_quant=out_quant, backend="torch")
    assert q.dtype == out_quant and q.shape == (5, 300) and s.shape == (5, 3)
    expected = oracle.scaled_mm(a, a_s, b, b_s, 128, 128, bias=bias)
    # The scales are those of the exact product (to fp32 rounding of the GEMM), the values one step at most.
    _, es = oracle.act_quant(torch.from_numpy(expected).float(), out_quant, 128)
    assert torch.allclose(s, es, rtol=REQUANT_SCALE_RTOL, atol=0)
    full = torch.from_numpy(np.repeat(s.double().numpy(), 128, 1)[:, :300])
    deq = torch.from_numpy(oracle.decode(q)) * full
    assert requant_within_one_step(deq, torch.from_numpy(expected), full, FMTS[out_quant])


def test_scaled_mm_other_block_shapes(gen):
    a, a_s, b, b_s = operands(3, 100, 200, torch.int8, gen, block=(32, 64))
    out = ops.scaled_mm(a, a_s, b, b_s, block_size=(32, 64), out_dtype=torch.float32, backend="torch")
    expected = oracle.scaled_mm(a, a_s, b, b_s, 32, 64)
    assert rel_error(out, torch.from_numpy(expected)) <= 1e-6


def test_scaled_mm_large_m(gen):
    a, a_s, b, b_s = operands(4096, 64, 192, torch.float8_e4m3fn, gen)
    out = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend="torch")
    assert rel_error(out, torch.from_numpy(oracle.scaled_mm(a, a_s, b, b_s, 128, 128))) <= 1e-5


@pytest.mark.parametrize("g_dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
@pytest.mark.parametrize("seed_layout", [False, True])
def test_dequant_bias(gen, g_dtype, seed_layout):
    M, N = 7, 300
    if g_dtype == torch.int32:
        g = torch.randint(-2**20, 2**20, (M, N), generator=gen, dtype=torch.int32)
    else:
        g = randn((M, N), gen=gen, dtype=g_dtype)
    sa, sb, bias = torch.rand(M, generator=gen) + 0.1, torch.rand(N, generator=gen) + 0.1, randn((N,), gen=gen)
    if seed_layout:  # seed 002's [M, 1] / [1, N] shapes
        sa, sb, bias = sa[:, None], sb[None, :], bias.to(torch.bfloat16)[None, :]
    out = ops.dequant_bias(g, sa, sb, bias, backend="torch")
    expected = (oracle.f32(g.double().numpy() * sa.double().reshape(M, 1).numpy()) * sb.double().reshape(1, N).numpy()
                + bias.double().reshape(1, N).numpy())
    assert out.dtype == torch.bfloat16 and out.shape == (M, N)
    assert rel_error(out, torch.from_numpy(expected)) <= 1e-2
    out32 = ops.dequant_bias(g, sa, sb, bias, out_dtype=torch.float32, backend="torch")
    assert rel_error(out32, torch.from_numpy(expected)) <= 1e-6


@pytest.mark.parametrize("scale_a_shape", [(0,), (0, 1)])
def test_dequant_bias_without_rows(scale_a_shape):
    # scale_a is [...] or [..., 1]: with no rows, both empty layouts are accepted alike.
    out = ops.dequant_bias(torch.ones(0, 8), torch.ones(scale_a_shape), torch.ones(8), torch.ones(8))
    assert out.shape == (0, 8) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_quantized_gelu(gen, qdtype, approximate):
    x = randn((3, 4, 257), gen=gen)
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    q2, s2 = ops.quantized_gelu(q, s, approximate=approximate, backend="torch")
    assert q2.dtype == qdtype and q2.shape == q.shape and s2.shape == s.shape
    deq = oracle.decode(q) * np.repeat(s.double().numpy(), 128, -1)[..., :257]
    expected = oracle.gelu(oracle.f32(deq), approximate)
    full = torch.from_numpy(np.repeat(s2.double().numpy(), 128, -1)[..., :257])
    got = torch.from_numpy(oracle.decode(q2)) * full
    assert requant_within_one_step(got, torch.from_numpy(expected), full, FMTS[qdtype])
    other = torch.int8 if qdtype != torch.int8 else torch.float8_e4m3fn
    q3, _ = ops.quantized_gelu(q, s, out_dtype=other, backend="torch")
    assert q3.dtype == other
