"""The opt-in `torch[bf16_dequant]` GEMM on a real GPU (cuBLAS's bf16 GEMM with an fp32 result): within
its declared bound of the reference on DeepSeek-V3 shapes and tails, its operands bit for bit the
reference's bf16 dequantization, and never chosen automatically, on the device and simulated as an
A100 (sm_80) and a Turing GPU (sm_75).

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import quantcore
from quantcore import ops
from quantcore.backends.torch import bf16_dequant
from quantcore.backends.torch import quant as torch_quant
from quantcore.definitions.tolerances import LOW_PRECISION_OUT, bf16_dequant_bound, rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")]

LABEL = "torch[bf16_dequant]"
SHAPES = [(4096, 2112, 7168), (4096, 7168, 2048), (600, 1000, 1040), (7, 129, 129)]
FORMATS = [torch.float8_e4m3fn, torch.int8]


def operands(qdtype, m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=g, device="cuda") * torch.exp(torch.randn(m, 1, generator=g, device="cuda"))
    w = torch.randn(n, k, generator=g, device="cuda") * 0.05
    a, a_s = ops.act_quant(x, dtype=qdtype)
    b, b_s = ops.weight_quant(w, dtype=qdtype)
    return a, a_s, b, b_s, torch.randn(n, generator=g, device="cuda")


@pytest.mark.parametrize("profile", [None, "sm80", "sm75"])
@pytest.mark.parametrize("qdtype", FORMATS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_within_its_bound_of_the_reference_and_never_automatic(m, n, k, qdtype, profile):
    a, a_s, b, b_s, bias = operands(qdtype, m, n, k)
    with quantcore.simulate(profile) if profile else contextlib.nullcontext():
        assert quantcore.explain("scaled_mm", a, a_s, b, b_s, bias=bias).selected != LABEL
        assert quantcore.explain("scaled_mm", a, a_s, b, b_s, backend="torch").selected != LABEL
        out = ops.scaled_mm(a, a_s, b, b_s, bias=bias, out_dtype=torch.float32, backend=LABEL)
        out_bf16 = ops.scaled_mm(a, a_s, b, b_s, bias=bias, backend=LABEL)
    ref = ops.scaled_mm(a, a_s, b, b_s, bias=bias, out_dtype=torch.float32, backend="torch")
    a32 = ops.act_dequant(a, a_s, out_dtype=torch.float32).double()
    b32 = ops.weight_dequant(b, b_s, out_dtype=torch.float32).double()
    sums = a32.abs() @ b32.abs().t()
    # The reference is not exact: its fp32 sum of per-K-block results errs by up to about (K/128)·2^-23 of
    # the sums, which the slack covers with the fp32 bias add.
    slack = 2.0**-16 * (sums + bias.double().abs())
    err = (out.double() - ref.double()).abs()
    assert bool((err <= bf16_dequant_bound(k) * sums + slack).all()), float((err / sums).max())
    assert rel_error(out_bf16, ref) <= LOW_PRECISION_OUT[torch.bfloat16]


@pytest.mark.parametrize("qdtype", FORMATS)
@pytest.mark.parametrize("m,n,k", SHAPES[2:])
def test_operands_are_the_reference_bf16_dequantization(m, n, k, qdtype):
    a, a_s, b, b_s, _ = operands(qdtype, m, n, k, seed=1)
    bf16 = torch.bfloat16
    assert torch.equal(torch_quant.dequantize(a, a_s, 1, 128, torch.bfloat16),
                       ops.act_dequant(a, a_s, out_dtype=bf16, backend="torch"))
    assert torch.equal(torch_quant.dequantize(b, b_s, 128, 128, torch.bfloat16),
                       ops.weight_dequant(b, b_s, out_dtype=bf16, backend="torch"))


@pytest.mark.parametrize("qdtype", FORMATS)
@pytest.mark.parametrize("m,n,k", SHAPES[1:3])
def test_a_plain_bf16_output_is_one_cublas_gemm_where_sums_round_once(m, n, k, qdtype, monkeypatch):
    """With reduced-precision reductions forbidden, a bf16 output without epilogue is cuBLAS's bf16 GEMM
    of the dequantized operands itself; with them allowed (torch's default), the fp32 result cast once."""
    a, a_s, b, b_s, _ = operands(qdtype, m, n, k, seed=3)
    a16, b16 = ops.act_dequant(a, a_s), ops.weight_dequant(b, b_s)
    out32 = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, backend=LABEL)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", True)
    assert torch.equal(ops.scaled_mm(a, a_s, b, b_s, backend=LABEL), out32.to(torch.bfloat16))
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)
    one_step = ops.scaled_mm(a, a_s, b, b_s, backend=LABEL)
    assert torch.equal(one_step, torch.mm(a16, b16.t()))
    # Both round the fp32 sums once: they differ by at most cuBLAS's summation order and one bf16 step.
    sums = a16.double().abs() @ b16.double().abs().t()
    err = (one_step.double() - out32.double()).abs()
    assert bool((err <= 2.0**-8 * out32.double().abs() + 2 * k * 2.0**-23 * sums).all())


def test_quant_linear_runs_it_on_the_gpu():
    a, a_s, b, b_s, bias = operands(torch.float8_e4m3fn, 256, 2112, 7168, seed=2)
    x = ops.act_dequant(a, a_s, out_dtype=torch.bfloat16)
    y = ops.quant_linear(x, b, b_s, bias, out_dtype=torch.float32, backend=LABEL)
    q, s = ops.act_quant(x, dtype=b.dtype, backend="torch")
    assert torch.equal(y, ops.scaled_mm(q, s, b, b_s, bias=bias, out_dtype=torch.float32, backend=LABEL))
    exact = ops.quant_linear(x, b, b_s, bias, out_dtype=torch.float32, backend="torch")
    assert rel_error(y, exact) <= LOW_PRECISION_OUT[torch.bfloat16]
