"""The fused producers (rms_norm_quant, silu_mul_quant) on the torch reference: against the independent
float64 oracle (bit for bit for the norm, within one quantization step for SiLU-and-multiply, whose exp
is each platform's), the unfused compositions they equal, the residual and masked variants, non-finite
inputs, and bad inputs. The Triton kernels are checked under the interpreter
(tests/backends/test_triton_producers.py), everything on a GPU by tests/gpu/test_producers_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import oracle
from helpers import assert_same_q, assert_same_scale, judge_silu_mul, norm_inputs, randn
from quantcore import InvalidInputError, ops
from quantcore.backends.torch.producers import pairwise_sum, rms_norm, silu_mul

FP8, I8 = torch.float8_e4m3fn, torch.int8


def expected_norm_quant(x, w, r, qdtype, group, ue8m0=False, eps=1e-6, quant_eps=1e-4):
    """The oracle's (q, scale[, new_residual]) of rms_norm_quant."""
    y, new_residual = oracle.rms_norm(x, w, r, eps)
    q, s = oracle.act_quant(torch.from_numpy(y), qdtype, min(group, x.shape[-1]), ue8m0=ue8m0, eps=quant_eps)
    return (q, s) if r is None else (q, s, new_residual)


def assert_same_outputs(got, expected):
    assert len(got) == len(expected)
    assert_same_q(got[0], expected[0])
    assert_same_scale(got[1], expected[1])
    if len(got) == 3:
        assert got[2].dtype == expected[2].dtype and torch.equal(got[2], expected[2])


@pytest.mark.parametrize("dtype,w_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                           (torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                           (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("H,group", [(1, 128), (200, 128), (512, 128), (300, 96), (130, 1000)])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_quant_is_the_oracle_bit_for_bit(dtype, w_dtype, H, group, residual):
    x, w, r = norm_inputs((3, H), dtype, w_dtype, residual=residual)
    for qdtype, ue8m0 in ((FP8, False), (I8, True)):
        got = ops.rms_norm_quant(x, w, r, dtype=qdtype, group_size=group, scale_fmt="ue8m0" if ue8m0 else "fp32")
        assert_same_outputs(got, expected_norm_quant(x, w, r, qdtype, group, ue8m0))


def test_rms_norm_quant_eps_options_and_leading_dims():
    x, w, r = norm_inputs((2, 3, 256), torch.bfloat16, residual=True)
    got = ops.rms_norm_quant(x, w, r, eps=0.25, quant_eps=0.5, dtype=I8)
    assert got[0].shape == (2, 3, 256) and got[1].shape == (2, 3, 2) and got[2].shape == (2, 3, 256)
    assert_same_outputs(got, expected_norm_quant(x, w, r, I8, 128, eps=0.25, quant_eps=0.5))


def test_the_sum_of_squares_is_the_pairwise_tree_in_any_power_of_two_width():
    """Padding with zeros to a wider power of two changes no bit (what lets kernels pad to their width)."""
    t = randn((4, 200), gen=torch.Generator().manual_seed(3)).square()
    s = pairwise_sum(t)
    assert torch.equal(s, pairwise_sum(F.pad(t, (0, 824))))
    expected = np.concatenate([t.double().numpy(), np.zeros((4, 56))], 1)  # 200 -> 256
    while expected.shape[1] > 1:
        expected = oracle.f32(expected[:, ::2] + expected[:, 1::2])
    assert np.array_equal(s.double().numpy(), expected[:, 0])


@pytest.mark.parametrize("layout", ["row", "m_major"])
def test_rms_norm_quant_is_act_quant_of_the_reference_norm(layout):
    """The unfused composition the contract names: act_quant(rms_norm(x)), bit for bit, with either layout."""
    x, w, r = norm_inputs((5, 300), torch.bfloat16, residual=True)
    q, s, new_residual = ops.rms_norm_quant(x, w, r, scale_layout=layout)
    y, expected_residual = rms_norm(x, w, r, 1e-6)
    eq, es = ops.act_quant(y, scale_layout=layout)
    assert_same_q(q, eq)
    assert_same_scale(s, es) and s.stride() == es.stride()
    assert torch.equal(new_residual, x + r) and torch.equal(new_residual, expected_residual)


def llama_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm.forward, as written there."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(x.dtype)


def test_the_norm_is_llamas_up_to_the_order_of_its_sum_and_its_rsqrt():
    """Where Llama's RMSNorm rounds, the contract rounds: the bf16 outputs differ only where the fp32 mean's
    summation order or rsqrt against 1/sqrt moves x·rstd across a bf16 rounding boundary (measured on the
    CPU: 2.4e-5 of the elements at H = 4096, none at 7168; docs/numerics.md), each by a bf16 ulp of x·rstd."""
    gen = torch.Generator().manual_seed(0)
    for H in (4096, 7168):
        x, w, _ = norm_inputs((256, H), torch.bfloat16, gen=gen)
        y, _ = rms_norm(x, w, None, 1e-6)
        llama = llama_rms_norm(x, w, 1e-6)
        differ = y != llama
        assert float(differ.float().mean()) < 1e-3
        ulp = 2.0 ** (torch.floor(torch.log2(llama.float().abs())) - 6)  # two bf16 ulps of the output
        assert bool(((y.float() - llama.float()).abs() <= ulp)[differ].all())


@pytest.mark.parametrize("qdtype", [FP8, I8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("width,group", [(2, 128), (400, 128), (1024, 128), (600, 64), (300, 1000)])
def test_silu_mul_quant_within_one_step_of_the_oracle(qdtype, dtype, width, group):
    gate_up = randn((4, width), dtype=dtype, gen=torch.Generator().manual_seed(width), scale=4.0)
    ue8m0 = group == 64
    q, s = ops.silu_mul_quant(gate_up, dtype=qdtype, group_size=group, scale_fmt="ue8m0" if ue8m0 else "fp32")
    judge_silu_mul(gate_up, q, s, min(group, width // 2), qdtype, ue8m0)


def test_silu_mul_quant_is_act_quant_of_the_fp32_product():
    """SiLU and the product in fp32, not rounded to the input's dtype: act_quant of the reference's fp32
    silu_mul bit for bit, where torch's own bf16 `F.silu(gate) * up` rounds twice (it differs in about a
    quarter of the bf16 values, 2.3e-3 relative, measured on the CPU)."""
    gate_up = randn((6, 2 * 300), dtype=torch.bfloat16, gen=torch.Generator().manual_seed(1), scale=2.0)
    q, s = ops.silu_mul_quant(gate_up, scale_layout="m_major")
    eq, es = ops.act_quant(silu_mul(gate_up), scale_layout="m_major")
    assert_same_q(q, eq)
    assert_same_scale(s, es) and s.stride() == es.stride()
    unfused = F.silu(gate_up[:, :300]) * gate_up[:, 300:]
    assert not torch.equal(unfused, silu_mul(gate_up).to(torch.bfloat16))


@pytest.mark.parametrize("layout", ["row", "m_major"])
def test_masked_rows_are_the_unmasked_op_where_counted(layout):
    """masked_m [E] counts each expert's rows of [E, max_m, 2I]; counts past max_m count as max_m and
    negative ones as 0. The counted rows are the unmasked op's; the reference computes the others too."""
    gate_up = randn((3, 5, 2 * 256), dtype=torch.bfloat16, gen=torch.Generator().manual_seed(2))
    counts = torch.tensor([2, 9, -1], dtype=torch.int32)
    q, s = ops.silu_mul_quant(gate_up, counts, dtype=I8, scale_layout=layout)
    eq, es = ops.silu_mul_quant(gate_up, dtype=I8, scale_layout=layout)
    assert q.shape == (3, 5, 256) and s.shape == (3, 5, 2) and s.stride() == es.stride()
    for e, n in enumerate((2, 5, 0)):
        assert torch.equal(q[e, :n], eq[e, :n]) and torch.equal(s[e, :n], es[e, :n])


def test_a_nan_poisons_its_rows_norm_an_inf_its_group_and_zeroes_the_row():
    """A NaN in a row makes the row's sum of squares NaN: every group of the row gets a NaN scale. An Inf
    makes it Inf, so rstd = 0: the Inf's group gets a NaN scale (Inf·0) and the row's other values are 0,
    as in the unfused fp32 code. Other rows are untouched; a NaN weight poisons its column's groups."""
    x, w, _ = norm_inputs((4, 384), torch.bfloat16)
    clean = x[2:].clone()
    x[0, 5], x[1, 200] = float("nan"), float("inf")
    q, s = ops.rms_norm_quant(x, w, dtype=I8)
    assert bool(s[0].isnan().all())
    floor = torch.tensor(1e-4) / torch.tensor(127.0)
    assert bool(s[1, 1].isnan()) and torch.equal(s[1, [0, 2]], floor.expand(2))
    assert not q[1, :128].any() and not q[1, 256:].any()
    assert_same_outputs((q[2:], s[2:]), ops.rms_norm_quant(clean, w, dtype=I8))
    w2 = w.clone()
    w2[300] = float("nan")
    _, s2 = ops.rms_norm_quant(clean, w2, dtype=I8)
    assert bool(s2[:, 2].isnan().all()) and not s2[:, :2].isnan().any()


def test_silu_mul_non_finite_values_stay_in_their_group():
    gate_up = randn((2, 2 * 256), gen=torch.Generator().manual_seed(4))
    gate_up[0, 3] = float("nan")  # gate of output column 3
    gate_up[1, 256 + 130] = float("inf")  # up of output column 130
    _, s = ops.silu_mul_quant(gate_up)
    assert bool(s[0, 0].isnan()) and bool(s[0, 1].isfinite())
    assert bool(s[1, 1].isinf()) and bool(s[1, 0].isfinite())


def test_empty_inputs_give_empty_outputs():
    x, w, r = norm_inputs((0, 64), torch.bfloat16, residual=True)
    q, s, new_residual = ops.rms_norm_quant(x, w, r)
    assert q.shape == (0, 64) and s.shape == (0, 1) and new_residual.shape == (0, 64)
    q, s = ops.silu_mul_quant(torch.ones(2, 0, 64), torch.zeros(2, dtype=torch.int32))
    assert q.shape == (2, 0, 32) and s.shape == (2, 0, 1)


_x, _w, _r = norm_inputs((4, 256), torch.bfloat16, residual=True)
_gu = torch.randn(4, 512)

BAD = [
    ("weight-length", lambda: ops.rms_norm_quant(_x, _w[:255]), "weight has shape (255,); expected (256,)"),
    ("weight-2d", lambda: ops.rms_norm_quant(_x, _w[None]), "weight has shape (1, 256)"),
    ("weight-dtype", lambda: ops.rms_norm_quant(_x, _w.to(I8)), "weight has dtype int8"),
    ("eps-zero", lambda: ops.rms_norm_quant(_x, _w, eps=0.0), "eps (the norm's, added to the mean of squares)"),
    ("eps-negative", lambda: ops.rms_norm_quant(_x, _w, eps=-1e-6), "must be a finite number > 0, got -1e-06"),
    ("eps-nan", lambda: ops.rms_norm_quant(_x, _w, eps=float("nan")), "the quantizer's amax floor is the separate"),
    ("eps-inf", lambda: ops.rms_norm_quant(_x, _w, eps=float("inf")), "must be a finite number > 0"),
    ("eps-underflows", lambda: ops.rms_norm_quant(_x, _w, eps=1e-50), "eps=1e-50 is 0.0 in fp32"),
    ("eps-overflows", lambda: ops.rms_norm_quant(_x, _w, eps=1e300), "eps=1e+300 is inf in fp32"),
    ("eps-bool", lambda: ops.rms_norm_quant(_x, _w, eps=True), "got True"),
    ("quant-eps", lambda: ops.rms_norm_quant(_x, _w, quant_eps=0.0), "quant_eps must be a finite number > 0"),
    ("quant-eps-underflows", lambda: ops.rms_norm_quant(_x, _w, quant_eps=1e-50), "use an quant_eps above"),
    ("residual-shape", lambda: ops.rms_norm_quant(_x, _w, _r[:3]), "residual is bfloat16 of shape (3, 256)"),
    ("residual-dtype", lambda: ops.rms_norm_quant(_x, _w, _r.float()), "expected x's dtype and shape, bfloat16"),
    ("residual-not-tensor", lambda: ops.rms_norm_quant(_x, _w, 1.0), "residual must be a torch.Tensor"),
    ("norm-x-int", lambda: ops.rms_norm_quant(_x.to(I8), _w), "rms_norm_quant: x has dtype int8"),
    ("norm-group", lambda: ops.rms_norm_quant(_x, _w, group_size=0), "group_size must be an int from 1"),
    ("norm-dtype", lambda: ops.rms_norm_quant(_x, _w, dtype=torch.float16), "dtype must be torch.float8_e4m3fn"),
    ("norm-layout", lambda: ops.rms_norm_quant(_x, _w, scale_layout="col"), "scale_layout must be one of"),
    ("norm-devices", lambda: ops.rms_norm_quant(_x, _w.to("meta")), "different devices"),
    ("silu-odd", lambda: ops.silu_mul_quant(torch.randn(4, 257)), "gate_up has an odd last dim (257"),
    ("silu-int", lambda: ops.silu_mul_quant(torch.ones(4, 8, dtype=torch.int32)), "gate_up has dtype int32"),
    ("silu-eps", lambda: ops.silu_mul_quant(_gu, eps=-1.0), "silu_mul_quant: eps must be a finite number > 0"),
    ("silu-scale-fmt", lambda: ops.silu_mul_quant(_gu, scale_fmt="e8m0"), "scale_fmt must be one of"),
    ("masked-2d", lambda: ops.silu_mul_quant(_gu, torch.ones(4, dtype=torch.int32)), "gate_up must be [E, max_m, 2I]"),
    ("masked-count", lambda: ops.silu_mul_quant(_gu.view(2, 2, 512), torch.ones(3, dtype=torch.int32)),
     "masked_m has shape (3,)"),
    ("masked-dtype", lambda: ops.silu_mul_quant(_gu.view(2, 2, 512), torch.ones(2, dtype=torch.int64)),
     "masked_m has dtype int64"),
]


@pytest.mark.parametrize("call,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_typed_error_naming_the_problem(call, fragment):
    with pytest.raises(InvalidInputError) as err:
        call()
    assert fragment in str(err.value)
    assert str(err.value).startswith(("rms_norm_quant: ", "silu_mul_quant: "))


def test_the_custom_op_without_residual_refuses_one():
    with pytest.raises(InvalidInputError, match="rms_norm_quant_residual takes one"):
        torch.ops.quantcore.rms_norm_quant(_x, _w, _r)
    with pytest.raises(InvalidInputError, match="rms_norm_quant_residual takes one"):
        torch.ops.quantcore.rms_norm_quant_residual(_x, _w)
