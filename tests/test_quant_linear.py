"""ops.quant_linear: act_quant followed by scaled_mm, bit for bit, through every path a user reaches it
by (quantcore.ops, torch.ops.quantcore, QuantLinear), with the ops' validation."""

from __future__ import annotations

import pytest
import torch

import quantcore
from helpers import randn
from quantcore import ops
from quantcore.nn import QuantLinear

FP8, INT8 = torch.float8_e4m3fn, torch.int8


def weight(gen, N, K, qdtype, block=(128, 128)):
    return ops.weight_quant(randn((N, K), gen=gen), dtype=qdtype, block_size=block)


@pytest.mark.parametrize("qdtype", [FP8, INT8])
@pytest.mark.parametrize("lead,N,K", [((1,), 70, 300), ((3,), 130, 256), ((2, 3), 130, 256), ((5,), 1, 1)])
@pytest.mark.parametrize("options", [{}, dict(activation="gelu", out_dtype=torch.float32, scale_fmt="ue8m0"),
                                     dict(block_size=(64, 32), eps=1e-2, activation="silu")])
def test_equals_act_quant_then_scaled_mm(gen, qdtype, lead, N, K, options):
    block = options.get("block_size", (128, 128))
    w, w_s = weight(gen, N, K, qdtype, block)
    x, bias = randn((*lead, K), gen=gen, dtype=torch.bfloat16), randn((N,), gen=gen)
    a, a_s = ops.act_quant(x, dtype=qdtype, group_size=block[1], scale_fmt=options.get("scale_fmt", "fp32"),
                           eps=options.get("eps", 1e-4))
    gemm = {k: v for k, v in options.items() if k in ("activation", "out_dtype", "block_size")}
    want = ops.scaled_mm(a, a_s, w, w_s, bias=bias, **gemm)
    got = ops.quant_linear(x, w, w_s, bias, **options)
    assert got.shape == (*lead, N) and torch.equal(got, want)
    assert torch.equal(torch.ops.quantcore.quant_linear(x, w, w_s, bias, **{**options, "block_size": list(block)}),
                       want)


@pytest.mark.parametrize("call,fragment", [
    (lambda x, w, s: ops.quant_linear(x.to(INT8), w, s), "x has dtype int8"),
    (lambda x, w, s: ops.quant_linear(x, w.float(), s), "w has dtype float32"),
    (lambda x, w, s: ops.quant_linear(x, w, s[:, :1]), "w_scale has shape"),
    (lambda x, w, s: ops.quant_linear(x[:, :100], w, s), "pass the weight, not its transpose"),
    (lambda x, w, s: ops.quant_linear(x, w, s, torch.zeros(3)), "bias has shape"),
    (lambda x, w, s: ops.quant_linear(x, w, s, activation="relu"), "activation must be one of"),
    (lambda x, w, s: ops.quant_linear(x, w, s, scale_fmt="e8m0"), "scale_fmt must be one of"),
])
def test_bad_input_names_the_problem(gen, call, fragment):
    w, s = weight(gen, 40, 256, FP8)
    with pytest.raises(quantcore.InvalidInputError, match=fragment):
        call(randn((3, 256), gen=gen), w, s)


def test_quant_linear_layer_runs_the_op(gen):
    linear = torch.nn.Linear(300, 70).to(torch.bfloat16)
    layer = QuantLinear.from_linear(linear, dtype=FP8)
    x = randn((2, 5, 300), gen=gen, dtype=torch.bfloat16)
    want = ops.quant_linear(x, layer.weight, layer.weight_scale_inv, layer.bias, out_dtype=torch.bfloat16)
    assert torch.equal(layer(x), want)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), want)


def test_explain_and_report_list_it(gen):
    w, s = weight(gen, 40, 256, INT8)
    assert quantcore.explain("quant_linear", randn((3, 256), gen=gen), w, s).selected == "torch"
    from quantcore import report

    assert {r.op for r in report.build("sm90").rows} >= {"quant_linear"}
