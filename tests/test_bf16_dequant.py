"""The opt-in `torch[bf16_dequant]` GEMM: never chosen unless named, its output within its declared
bound of the float64 oracle, its epilogue the reference's on its fp32 result, the same input
validation as every backend, and its numerics shown by explain() and the report."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch import nn

import oracle
import quantcore
from binding import simulate_on_cpu
from helpers import assert_same_q, randn
from quantcore import InvalidInputError, NumericsWarning, capability, definitions, ops, registry, report
from quantcore.registry import measured
from quantcore.registry import impl as base
from quantcore.backends.torch import bf16_dequant
from quantcore.backends.torch import quant as torch_quant
from quantcore.definitions.gradients import activation_grad
from quantcore.nn import QuantLinear
from quantcore.definitions.query import GemmQuery
from quantcore.definitions.tolerances import BF16_DEQUANT_ADDITION, GEMM_FP32_OUT, bf16_dequant_bound, rel_error
from test_validation import BAD

LABEL = "torch[bf16_dequant]"
GEMMS = ("scaled_mm", "quant_linear")
FORMATS = {"fp8_e4m3": torch.float8_e4m3fn, "int8": torch.int8}
PROFILES = ["cpu", *capability.SIMULATED]
# (M, N, K, (Bn, Bk)): tails in every dimension, a K shorter than one block, a non-square block.
SHAPES = [(7, 129, 300, (128, 128)), (33, 200, 257, (128, 128)), (1, 64, 100, (128, 128)),
          (130, 257, 1000, (128, 128)), (5, 70, 200, (32, 64))]
ACTIVATIONS = [None, "gelu", "gelu_tanh", "silu"]

pytestmark = pytest.mark.filterwarnings("ignore::quantcore.NumericsWarning")


def operands(fmt, m, n, k, block, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qdtype = FORMATS[fmt]
    a, a_s = ops.act_quant(randn((m, k), gen=gen), dtype=qdtype, group_size=block[1])
    b, b_s = ops.weight_quant(randn((n, k), gen=gen, scale=0.05), dtype=qdtype, block_size=block)
    return a, a_s, b, b_s, randn((n,), gen=gen)


def abs_products(a, a_s, b, b_s, block) -> np.ndarray:
    """Σ_k |a_k·b_k| of the exact dequantized operands, float64 [M, N]."""
    (n, k), (bn, bk) = b.shape, block
    A = oracle.decode(a) * np.repeat(a_s.double().numpy(), bk, 1)[:, :k]
    B = oracle.decode(b) * np.repeat(np.repeat(b_s.double().numpy(), bn, 0), bk, 1)[:n, :k]
    return np.abs(A) @ np.abs(B).T


def lipschitz(activation) -> float:
    """max |act'(x)|: how much the epilogue's activation can amplify an error of its input."""
    if activation is None:
        return 1.0
    return float(activation_grad(torch.linspace(-30, 30, 600001, dtype=torch.float64), activation).abs().max())


# --- opt-in: never selected automatically ------------------------------------------------------------

def _auto_choices(op):
    """Every way of choosing without naming the variant: automatic, each backend by name, priority lists."""
    backends = sorted({i.backend for i in registry.impls(op)})
    return [None, "auto", *backends, tuple(backends), ("torch",), ("triton", "cupy")]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("op", GEMMS)
def test_never_selected_without_being_named(monkeypatch, op, profile):
    simulate_on_cpu(monkeypatch, profile)
    for fmt in FORMATS:
        args, kwargs = definitions.get(op).example(fmt)
        query = definitions.get(op).spec(*args, **kwargs).query
        for backend in _auto_choices(op):
            explained = quantcore.explain(op, *args, backend=backend, **kwargs)
            assert explained.selected != LABEL, (profile, fmt, backend)
            row = next(c for c in explained.candidates if c.impl == LABEL)
            assert row.numerics == bf16_dequant.NUMERICS and row.status in ("available", "unavailable")
            if isinstance(backend, str) and backend != "auto":
                continue  # an explicit backend= raises where it cannot run; select() is checked below
            assert registry.select(query, backend).label != LABEL
        for env in ("torch", "triton,cupy,torch"):
            monkeypatch.setenv("QUANTCORE_PRIORITY", env)
            assert registry.select(query).label != LABEL
        monkeypatch.delenv("QUANTCORE_PRIORITY")
        with quantcore.priority("torch"):
            assert registry.select(query).label != LABEL
    assert LABEL not in registry.compared(op)  # so neither the bench nor a measured priority ranks it


def test_a_measured_table_naming_it_is_not_followed(monkeypatch):
    h100 = capability.simulated_profile("sm90").model_copy(update={"name": "NVIDIA H100 80GB HBM3"})
    monkeypatch.setattr(measured, "table", lambda name: {"scaled_mm/fp8_e4m3": {1: (LABEL, "cupy")}})
    monkeypatch.setattr(measured, "table_by_k", lambda name: {})
    for module in (capability, base):  # CuPy counted as installed
        monkeypatch.setattr(module, "module_available", lambda _: True)
    query = GemmQuery("scaled_mm", h100, "fp8_e4m3", blocks=(128, 128), m_bucket=4096, nk=(2112, 7168), block_k=128)
    assert registry.current_priority(query) == ("cupy", "triton", "torch")
    assert registry.select(query).label == "cupy"


@pytest.mark.parametrize("op", GEMMS)
def test_forcing_it_runs_it_and_warns_once(monkeypatch, op):
    args, kwargs = definitions.get(op).example("fp8_e4m3")
    default = getattr(quantcore.ops, op)(*args, **kwargs)
    with pytest.warns(NumericsWarning, match="operands rounded to bf16 after scaling"):
        forced = getattr(quantcore.ops, op)(*args, backend=LABEL, **kwargs)
    assert not torch.equal(forced, default)  # bf16 operands: a different function
    for choice in ((LABEL,), (LABEL, "triton")):
        assert torch.equal(getattr(quantcore.ops, op)(*args, backend=choice, **kwargs), forced)
    with quantcore.priority(LABEL):
        assert torch.equal(getattr(quantcore.ops, op)(*args, **kwargs), forced)
    monkeypatch.setenv("QUANTCORE_PRIORITY", f"{LABEL},triton")
    assert torch.equal(getattr(quantcore.ops, op)(*args, **kwargs), forced)


def test_needs_torch_with_an_fp32_bf16_gemm_on_cuda(monkeypatch):
    sm80 = capability.simulated_profile("sm80")
    query = registry.Query("scaled_mm", sm80, "fp8_e4m3")
    impl = next(i for i in registry.impls("scaled_mm") if i.label == LABEL)
    assert impl.not_supported_reasons(query) == []
    # torch before 2.8 has no mm.dtype overload
    monkeypatch.setattr(torch.ops.aten, "mm", types.SimpleNamespace(overloads=lambda: ["default", "out"]))
    assert impl.not_supported_reasons(query) == [
        f"needs torch >= 2.8 on CUDA (torch.mm with out_dtype=float32 from bf16), torch is {torch.__version__}"]
    assert impl.not_supported_reasons(registry.Query("scaled_mm", capability.cpu_profile(), "int8")) == []


# --- numerics ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k,block", SHAPES)
def test_operands_are_bf16_dequantized_bit_for_bit(fmt, m, n, k, block):
    a, a_s, b, b_s, _ = operands(fmt, m, n, k, block)
    bf16 = torch.bfloat16
    assert torch.equal(torch_quant.dequantize(a, a_s, 1, block[1], torch.bfloat16),
                       ops.act_dequant(a, a_s, group_size=block[1], out_dtype=bf16))
    assert torch.equal(torch_quant.dequantize(b, b_s, block[0], block[1], torch.bfloat16),
                       ops.weight_dequant(b, b_s, block_size=block, out_dtype=bf16))
    m_major = a_s.t().contiguous().t()
    assert torch.equal(torch_quant.dequantize(a, m_major, 1, block[1], torch.bfloat16),
                       torch_quant.dequantize(a, a_s, 1, block[1], torch.bfloat16))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k,block", SHAPES)
def test_the_gemm_sums_the_bf16_operands_in_fp32(fmt, m, n, k, block):
    a, a_s, b, b_s, _ = operands(fmt, m, n, k, block)
    a16 = ops.act_dequant(a, a_s, group_size=block[1], out_dtype=torch.bfloat16).double().numpy()
    b16 = ops.weight_dequant(b, b_s, block_size=block, out_dtype=torch.bfloat16).double().numpy()
    out = ops.scaled_mm(a, a_s, b, b_s, block_size=block, out_dtype=torch.float32, backend=LABEL).double().numpy()
    assert (np.abs(out - a16 @ b16.T) <= k * BF16_DEQUANT_ADDITION * (np.abs(a16) @ np.abs(b16).T)).all()


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k,block", SHAPES)
def test_fp32_output_within_the_declared_bound_of_the_exact_function(fmt, m, n, k, block, activation):
    a, a_s, b, b_s, bias = operands(fmt, m, n, k, block, seed=m + n + k)
    out = ops.scaled_mm(a, a_s, b, b_s, bias=bias, activation=activation, block_size=block, out_dtype=torch.float32,
                        backend=LABEL)
    exact = oracle.scaled_mm(a, a_s, b, b_s, *block, bias=bias, act=activation)
    sums = abs_products(a, a_s, b, b_s, block)
    # The bound carried through the activation, plus the fp32 epilogue's own roundings (bias, activation).
    slack = 2.0**-18 * (sums + np.abs(bias.double().numpy()))
    err = np.abs(out.double().numpy() - exact)
    assert (err <= lipschitz(activation) * bf16_dequant_bound(k) * sums + slack).all(), err.max()
    assert rel_error(out, torch.from_numpy(exact)) > GEMM_FP32_OUT[fmt]  # the numerics did change


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k,block", SHAPES)
def test_every_epilogue_is_the_reference_one_on_the_fp32_result(fmt, m, n, k, block, activation):
    a, a_s, b, b_s, bias = operands(fmt, m, n, k, block, seed=1)
    call = dict(bias=bias, activation=activation, block_size=block, backend=LABEL)
    fp32 = ops.scaled_mm(a, a_s, b, b_s, out_dtype=torch.float32, **call)
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(ops.scaled_mm(a, a_s, b, b_s, out_dtype=dtype, **call), fp32.to(dtype))
    for out_quant in FORMATS.values():
        for group, scale_fmt in ((128, "fp32"), (48, "ue8m0")):
            q, s = ops.scaled_mm(a, a_s, b, b_s, out_quant=out_quant, out_group_size=group, out_scale_fmt=scale_fmt,
                                 **call)
            q_ref, s_ref = ops.act_quant(fp32, dtype=out_quant, group_size=min(group, n), scale_fmt=scale_fmt)
            assert_same_q(q, q_ref)
            assert torch.equal(s, s_ref)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quant_linear_is_act_quant_then_its_scaled_mm(fmt):
    gen = torch.Generator().manual_seed(3)
    x = randn((2, 3, 300), gen=gen, dtype=torch.bfloat16)
    w, w_s = ops.weight_quant(randn((129, 300), gen=gen), dtype=FORMATS[fmt])
    bias = randn((129,), gen=gen)
    y = ops.quant_linear(x, w, w_s, bias, activation="gelu", out_dtype=torch.float32, backend=LABEL)
    a, a_s = ops.act_quant(x, dtype=w.dtype, group_size=128)
    expected = ops.scaled_mm(a, a_s, w, w_s, bias=bias, activation="gelu", out_dtype=torch.float32, backend=LABEL)
    assert y.shape == (2, 3, 129) and torch.equal(y, expected)


# --- validation --------------------------------------------------------------------------------------

GEMM_BAD = [b for b in BAD if b[0].startswith(("scaled_mm", "unknown-backend", "backend-"))]


@pytest.mark.parametrize("call,fragment", [b[1:] for b in GEMM_BAD], ids=[b[0] for b in GEMM_BAD])
def test_bad_input_raises_what_every_backend_raises(call, fragment):
    with pytest.raises(InvalidInputError) as plain:
        call()
    with quantcore.priority(LABEL), pytest.raises(InvalidInputError) as opted_in:
        call()
    assert str(opted_in.value) == str(plain.value) and fragment in str(plain.value)


def test_bad_input_with_the_variant_forced():
    x, wq, ws = torch.randn(4, 256), torch.randn(256, 256).to(torch.int8), torch.ones(2, 2)
    with pytest.raises(InvalidInputError, match="scaled_mm: a has dtype float32"):
        ops.scaled_mm(x, torch.ones(4, 2), wq, ws, backend=LABEL)
    with pytest.raises(InvalidInputError, match="quant_linear: .*w_scale has shape \\(3, 2\\)"):
        ops.quant_linear(x, wq, torch.ones(3, 2), backend=LABEL)


# --- explain and report ------------------------------------------------------------------------------

def test_explain_shows_its_numerics_chosen_or_not():
    args, kwargs = definitions.get("scaled_mm").example("int8")
    chosen = quantcore.explain("scaled_mm", *args, backend=LABEL, **kwargs)
    assert chosen.selected == LABEL and chosen.numerics == bf16_dequant.NUMERICS
    assert f"runs {LABEL} (numerics: operands rounded to bf16 after scaling" in str(chosen)
    for backend in (None, "torch"):
        text = str(quantcore.explain("scaled_mm", *args, backend=backend, **kwargs))
        row = next(line for line in text.splitlines() if line.strip().startswith(LABEL))
        assert "available" in row and "opt-in, changes numerics: runs only when named" in row
        assert f"[numerics: {bf16_dequant.NUMERICS}]" in row
    with quantcore.priority("torch", LABEL):
        ranked = quantcore.explain("scaled_mm", *args, **kwargs)
    assert {c.impl: c.reasons for c in ranked.candidates}[LABEL] == ["lower priority"]


@pytest.mark.parametrize("simulate", ["cpu", "sm75", "sm80", "sm90"])
def test_the_report_lists_it_as_opt_in_with_its_numerics(simulate):
    rep = report.build(simulate)
    rows = [r for r in rep.rows if r.impl == LABEL]
    assert {(r.op, r.dtype) for r in rows} == {(op, fmt) for op in GEMMS for fmt in FORMATS}
    assert all(r.status == "available" and r.reason.startswith("opt-in") and r.numerics == bf16_dequant.NUMERICS
               for r in rows)
    assert all(r.selected != LABEL for r in rep.by_m)
    text = report.render(rep)
    assert sum(LABEL in line and "opt-in" in line and "[numerics: operands rounded to bf16" in line
               for line in text.splitlines()) == len(rows)


# --- quantcore.nn ------------------------------------------------------------------------------------

def test_a_model_opts_in_through_a_priority(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    model = nn.Sequential(QuantLinear.from_linear(nn.Linear(300, 200), dtype="fp8"), nn.GELU(),
                          QuantLinear.from_linear(nn.Linear(200, 70), dtype="int8"))
    x = randn((9, 300), gen=gen)
    first = model[0]
    h = ops.quant_linear(x, first.weight, first.weight_scale_inv, first.bias, out_dtype=x.dtype, backend=LABEL)
    last = model[2]
    expected = ops.quant_linear(model[1](h), last.weight, last.weight_scale_inv, last.bias, out_dtype=x.dtype,
                                backend=LABEL)
    exact = model(x)
    with quantcore.priority(LABEL):
        assert torch.equal(model(x), expected)
        assert torch.equal(torch.ops.quantcore.quant_linear(x, first.weight, first.weight_scale_inv, first.bias,
                                                            out_dtype=x.dtype), h)  # the compiled path's op
    assert not torch.equal(exact, expected) and torch.equal(model(x), exact)
    monkeypatch.setenv("QUANTCORE_PRIORITY", LABEL)
    assert torch.equal(model(x), expected)
