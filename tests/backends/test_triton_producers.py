"""The fused producers' Triton kernels on the CPU under TRITON_INTERPRET=1, against the torch reference:
rms_norm_quant bit for bit (the sum of squares in the contract's order, the norm's roundings, the residual
and the codes and scales), silu_mul_quant against the oracle (exp is each platform's) and, where counted,
its masked rows. Few, small cases: the interpreter runs numpy per program."""

from __future__ import annotations

import torch

import pytest  # noqa: E402

pytest.importorskip("triton")
from helpers import (INTERPRETER_ONLY, assert_same_q, assert_same_scale, judge_silu_mul, norm_inputs,  # noqa: E402
                     randn)
from quantcore import ops  # noqa: E402

pytestmark = [
    INTERPRETER_ONLY,
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

FP8, I8 = torch.float8_e4m3fn, torch.int8


def assert_same(got, expected):
    assert len(got) == len(expected)
    assert_same_q(got[0], expected[0])
    assert_same_scale(got[1], expected[1])
    # The layout (M-major or not), the stride of a dim of size 1 aside.
    assert [st for st, n in zip(got[1].stride(), got[1].shape) if n > 1] == [
        st for st, n in zip(expected[1].stride(), expected[1].shape) if n > 1]
    if len(got) == 3:
        assert torch.equal(got[2], expected[2])


# (x dtype, weight dtype, H, group): groups of a power of two (the row summed from the group tile), one group
# (group > H), and groups of 96 (the row loaded again as one vector for the sum); a tail in each.
NORM_CASES = [(torch.bfloat16, torch.bfloat16, 200, 128), (torch.float16, torch.float32, 300, 96),
              (torch.float32, torch.bfloat16, 70, 128), (torch.bfloat16, torch.float16, 1, 128)]


@pytest.mark.parametrize("dtype,w_dtype,H,group", NORM_CASES)
def test_rms_norm_quant_is_the_reference_bit_for_bit(dtype, w_dtype, H, group):
    x, w, r = norm_inputs((3, H), dtype, w_dtype, residual=True)
    wide = torch.full((3, H + 13), float("nan"), dtype=dtype)  # rows strided, the gap poisoned
    wide[:, :H] = x
    x = wide[:, :H]
    for residual, qdtype, fmt, layout in ((None, FP8, "fp32", "row"), (r, I8, "ue8m0", "m_major")):
        kw = dict(dtype=qdtype, group_size=group, scale_fmt=fmt, scale_layout=layout)
        assert_same(ops.rms_norm_quant(x, w, residual, backend="triton", **kw),
                    ops.rms_norm_quant(x, w, residual, backend="torch", **kw))


def test_rms_norm_quant_non_finite_rows_as_the_reference():
    x, w, _ = norm_inputs((3, 256), torch.bfloat16)
    x[0, 7], x[1, 130] = float("nan"), float("-inf")
    assert_same(ops.rms_norm_quant(x, w, dtype=I8, backend="triton"),
                ops.rms_norm_quant(x, w, dtype=I8, backend="torch"))


@pytest.mark.parametrize("dtype,width,group", [(torch.bfloat16, 2 * 200, 128), (torch.float32, 2 * 100, 48)])
def test_silu_mul_quant_within_one_step(dtype, width, group):
    gate_up = randn((3, width), dtype=dtype, gen=torch.Generator().manual_seed(5), scale=4.0)
    for qdtype, fmt in ((FP8, "fp32"), (I8, "ue8m0")):
        q, s = ops.silu_mul_quant(gate_up, dtype=qdtype, group_size=group, scale_fmt=fmt, backend="triton")
        judge_silu_mul(gate_up, q, s, group, qdtype, fmt == "ue8m0")


def test_masked_rows_are_written_where_counted_only():
    gate_up = randn((3, 4, 2 * 160), dtype=torch.bfloat16, gen=torch.Generator().manual_seed(6))
    counts = torch.tensor([1, 7, 0], dtype=torch.int32)  # 7 counts as the 4 rows there are
    q, s = ops.silu_mul_quant(gate_up, counts, backend="triton", dtype=I8, scale_layout="m_major")
    unwritten = torch.ones(3, 4, dtype=torch.bool)
    unwritten[0, :1] = unwritten[1] = False
    rows = (~unwritten).flatten().nonzero().flatten()
    judge_silu_mul(gate_up, q, s, 128, I8, rows=rows)
    eq, es = ops.silu_mul_quant(gate_up, backend="triton", dtype=I8, scale_layout="m_major")
    assert torch.equal(q[~unwritten], eq[~unwritten]) and torch.equal(s[~unwritten], es[~unwritten])


def test_a_second_call_runs_from_the_kept_plan():
    x, w, r = norm_inputs((2, 130), torch.bfloat16, residual=True)
    gate_up = randn((2, 260), gen=torch.Generator().manual_seed(8))
    runs = [(*ops.rms_norm_quant(x, w, r, backend="triton"), *ops.silu_mul_quant(gate_up, backend="triton"))
            for _ in range(2)]
    assert all(torch.equal(a.view(torch.uint8) if a.dtype == FP8 else a, b.view(torch.uint8) if b.dtype == FP8 else b)
               for a, b in zip(*runs, strict=True))

