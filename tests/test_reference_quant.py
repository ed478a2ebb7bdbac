"""The torch reference's quantize/dequantize against the independent float64 oracle: bit-exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import oracle
from helpers import assert_same_q, assert_same_scale, randn
from quantcore import ops

QDTYPES = [torch.float8_e4m3fn, torch.int8]


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("K", [1, 64, 127, 128, 129, 576])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 6, 7])
def test_act_quant_matches_oracle_on_tails(gen, qdtype, K, M):
    x = randn((M, K), gen=gen)
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    eq, es = oracle.act_quant(x, qdtype, 128)
    assert_same_q(q, eq)
    assert_same_scale(s, es)


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
def test_act_quant_dtypes_and_ue8m0(gen, qdtype, in_dtype, scale_fmt):
    x = randn((4096, 129), dtype=in_dtype, gen=gen)
    q, s = ops.act_quant(x, dtype=qdtype, scale_fmt=scale_fmt, backend="torch")
    eq, es = oracle.act_quant(x, qdtype, 128, ue8m0=scale_fmt == "ue8m0")
    assert_same_q(q, eq)
    assert_same_scale(s, es)
    if scale_fmt == "ue8m0":  # every scale is a power of two: mantissa bits all zero
        assert int((s.view(torch.int32) & 0x7FFFFF).abs().sum()) == 0


@pytest.mark.parametrize("group", [32, 64, 100, 256])
def test_act_quant_other_group_sizes_and_leading_dims(gen, group):
    x = randn((2, 3, 5, 300), gen=gen)
    q, s = ops.act_quant(x, dtype=torch.int8, group_size=group, backend="torch")
    assert q.shape == x.shape and s.shape == (2, 3, 5, math.ceil(300 / group))
    eq, es = oracle.act_quant(x, torch.int8, group)
    assert_same_q(q, eq)
    assert_same_scale(s, es)


def test_act_quant_m_major_layout(gen):
    x = randn((6, 384), gen=gen)
    q, s = ops.act_quant(x, scale_layout="m_major", backend="torch")
    _, es = oracle.act_quant(x, torch.float8_e4m3fn, 128)
    assert s.stride() == (1, 6), "M-major: the rows dimension is the fastest"
    assert_same_scale(s.contiguous(), es)
    y = ops.act_dequant(q, s, out_dtype=torch.float32, backend="torch")
    assert torch.equal(y, ops.act_dequant(q, s.contiguous(), out_dtype=torch.float32, backend="torch"))


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_zero_blocks_get_the_eps_scale(qdtype):
    x = torch.zeros(3, 256)
    x[1, 130] = 5.0
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    floor = torch.tensor(1e-4, dtype=torch.float32) / oracle.QMAX[qdtype]
    assert torch.equal(s[0], floor.expand(2)) and s[1, 0] == floor
    assert s[1, 1] == torch.tensor(5.0) / oracle.QMAX[qdtype]
    assert q.float().abs().sum() == oracle.QMAX[qdtype]


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("eps", [1e-40, 3e38])
def test_eps_at_the_ends_of_its_range_gives_finite_scales(gen, qdtype, eps):
    # The floor is used in fp32: a subnormal or near-overflow eps still gives a positive finite scale.
    x = randn((3, 256), gen=gen)
    x[0] = 0
    q, s = ops.act_quant(x, dtype=qdtype, eps=eps, backend="torch")
    assert bool(torch.isfinite(s).all()) and bool((s > 0).all()) and not q.float().isnan().any()
    eq, es = oracle.act_quant(x, qdtype, 128, eps=eps)
    assert_same_q(q, eq)
    assert_same_scale(s, es)


# (eps, ue8m0 scale of an all-zero FP8 block): eps/448 subnormal (about 2^-141.8; exactly 2^-127), exactly
# the smallest normal 2^-126, and just above it.
UE8M0_EDGE = [(1e-40, 2.0**-126), (7 * 2.0**-121, 2.0**-126), (7 * 2.0**-120, 2.0**-126),
              (7 * 2.0**-120 * 1.0000001, 2.0**-125)]


@pytest.mark.parametrize("eps,expected", UE8M0_EDGE)
def test_ue8m0_scales_are_normal_powers_of_two_at_the_subnormal_edge(gen, eps, expected):
    x = randn((2, 256), gen=gen)
    x[:, :128] = 0
    q, s = ops.act_quant(x, eps=eps, scale_fmt="ue8m0", backend="torch")
    assert float(s[0, 0]) == float(s[1, 0]) == expected
    eq, es = oracle.act_quant(x, torch.float8_e4m3fn, 128, ue8m0=True, eps=eps)
    assert_same_q(q, eq)
    assert_same_scale(s, es)
    w = torch.zeros(3, 5)
    assert float(ops.weight_quant(w, eps=eps, scale_fmt="ue8m0", backend="torch")[1]) == expected


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_non_finite_blocks_are_confined(gen, qdtype):
    x = randn((4, 384), gen=gen)
    x[0, 5] = float("nan")
    x[1, 200] = float("inf")
    x[2, 300] = -float("inf")
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    assert s[0, 0].isnan() and s[1, 1].isinf() and s[2, 2].isinf()
    finite = torch.ones_like(s, dtype=torch.bool)
    finite[0, 0] = finite[1, 1] = finite[2, 2] = False
    assert torch.isfinite(s[finite]).all()
    eq, es = oracle.act_quant(x, qdtype, 128)
    assert_same_scale(s, es)
    assert_same_q(q, eq)
    if qdtype == torch.int8:  # NaN quotients become 0 in INT8
        assert q[0, :128].abs().sum() == 0


def test_check_finite_raises_instead():
    x = torch.ones(2, 128)
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        ops.act_quant(x, check_finite=True)


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_saturation_at_block_max(qdtype):
    # Every block's largest value maps to exactly ±qmax; values can't exceed it.
    x = torch.tensor([[1000.0, -1000.0, 3.0, 999.99] + [0.5] * 124])
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    v = q.float()
    assert v[0, 0] == oracle.QMAX[qdtype] and v[0, 1] == -oracle.QMAX[qdtype]
    assert v.abs().max() <= oracle.QMAX[qdtype]
    assert not v.isnan().any()


def test_fp8_rounding_carry_into_exponent():
    # 127.9 / s must round to 128 (a carry into the exponent), the case Triton's interpreter gets wrong.
    x = torch.tensor([[448.0, 127.9, 239.9, -120.1]])
    q, s = ops.act_quant(x, backend="torch")
    assert s.item() == 1.0
    assert q.float().tolist() == [[448.0, 128.0, 240.0, -120.0]]


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 129), (130, 576), (256, 128), (129, 127)])
@pytest.mark.parametrize("block", [(128, 128), (64, 32)])
@pytest.mark.parametrize("scale_fmt", ["fp32", "ue8m0"])
def test_weight_quant_matches_oracle(gen, qdtype, shape, block, scale_fmt):
    w = randn(shape, gen=gen)
    q, s = ops.weight_quant(w, dtype=qdtype, block_size=block, scale_fmt=scale_fmt, backend="torch")
    eq, es = oracle.weight_quant(w, qdtype, *block, ue8m0=scale_fmt == "ue8m0")
    assert s.shape == (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
    assert_same_q(q, eq)
    assert_same_scale(s, es)


@pytest.mark.parametrize("qdtype", QDTYPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequant_is_one_fp32_multiply_then_a_cast(gen, qdtype, out_dtype):
    x = randn((5, 2, 300), gen=gen)
    q, s = ops.act_quant(x, dtype=qdtype, backend="torch")
    y = ops.act_dequant(q, s, out_dtype=out_dtype, backend="torch")
    full = np.repeat(s.double().numpy(), 128, axis=-1)[..., :300]
    assert torch.equal(y, oracle.dequant(q, full, out_dtype))
    w = randn((200, 300), gen=gen)
    wq, ws = ops.weight_quant(w, dtype=qdtype, backend="torch")
    wy = ops.weight_dequant(wq, ws, out_dtype=out_dtype, backend="torch")
    wfull = np.repeat(np.repeat(ws.double().numpy(), 128, 0), 128, 1)[:200, :300]
    assert torch.equal(wy, oracle.dequant(wq, wfull, out_dtype))


def test_round_trip_error_is_within_half_a_step(gen):
    x = randn((64, 512), gen=gen)
    q, s = ops.act_quant(x, dtype=torch.int8, backend="torch")
    y = ops.act_dequant(q, s, out_dtype=torch.float32, backend="torch")
    step = s.repeat_interleave(128, dim=-1)
    assert ((y - x).abs() <= step / 2 + 1e-6).all()


HUGE = 2**31  # a valid group size: padding a block to it would allocate gigabytes


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_blocks_larger_than_the_dimension_are_the_dimension(gen, qdtype):
    x = randn((2, 10), gen=gen)
    q, s = ops.act_quant(x, dtype=qdtype, group_size=HUGE, backend="torch")
    eq, es = ops.act_quant(x, dtype=qdtype, group_size=10, backend="torch")
    assert s.shape == (2, 1)
    assert_same_q(q, eq)
    assert_same_scale(s, es)
    assert torch.equal(ops.act_dequant(q, s, group_size=HUGE, backend="torch"),
                       ops.act_dequant(q, s, group_size=10, backend="torch"))
    g, gs = ops.quantized_gelu(q, s, group_size=HUGE, backend="torch")
    eg, egs = ops.quantized_gelu(q, s, group_size=10, backend="torch")
    assert_same_q(g, eg)
    assert_same_scale(gs, egs)
    w = randn((3, 5), gen=gen)
    wq, ws = ops.weight_quant(w, dtype=qdtype, block_size=(HUGE, 2**40), backend="torch")
    ewq, ews = ops.weight_quant(w, dtype=qdtype, block_size=(3, 5), backend="torch")
    assert ws.shape == (1, 1)
    assert_same_q(wq, ewq)
    assert_same_scale(ws, ews)
    assert torch.equal(ops.weight_dequant(wq, ws, block_size=(HUGE, HUGE), backend="torch"),
                       ops.weight_dequant(wq, ws, block_size=(3, 5), backend="torch"))


def test_gemm_blocks_larger_than_the_dimension_are_the_dimension(gen):
    a, a_s = ops.act_quant(randn((2, 10), gen=gen), dtype=torch.int8, group_size=HUGE, backend="torch")
    b, b_s = ops.weight_quant(randn((3, 10), gen=gen), dtype=torch.int8, block_size=(HUGE, HUGE), backend="torch")
    for out_quant in (None, torch.int8):
        kw = dict(out_quant=out_quant, out_dtype=torch.float32, activation="silu", backend="torch")
        got = ops.scaled_mm(a, a_s, b, b_s, block_size=(HUGE, HUGE), out_group_size=HUGE, **kw)
        expected = ops.scaled_mm(a, a_s, b, b_s, block_size=(3, 10), out_group_size=3, **kw)
        for t, e in zip(got if out_quant else (got,), expected if out_quant else (expected,)):
            assert torch.equal(t, e)


def test_empty_rows_give_empty_outputs():
    q, s = ops.act_quant(torch.randn(0, 256))
    assert q.shape == (0, 256) and s.shape == (0, 2)
