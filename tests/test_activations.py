"""The epilogue activations (GELU, tanh-GELU, SiLU) of the torch reference against the float64 oracle
from −120 to 20, the negative tail dense, directly and through the public ops."""

from __future__ import annotations

import pytest
import torch

from helpers import TAIL_EPS, activation_inputs, check_activation, judge_quantized_gelu, tail_blocks, tail_gemm_operands
from quantcore import ops
from quantcore.backends.torch.activation import activate

ACTIVATIONS = ["gelu", "gelu_tanh", "silu"]
FMTS = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_matches_float64_over_the_whole_range(name):
    x = activation_inputs()
    check_activation(activate(x, name), x, name)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_non_finite_inputs(name):
    y = activate(torch.tensor([float("inf"), -float("inf"), float("nan"), 1e38, -1e38]), name)
    assert y[0] == float("inf") and y[1] == 0 and y[2].isnan() and y[3] == 1e38 and y[4] == 0


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_scaled_mm_epilogue_activation(qdtype, name):
    x = activation_inputs()
    x = x[x != 0][::7].contiguous()  # 0 + (−0) is +0: the epilogue never sees a −0
    out = ops.scaled_mm(*tail_gemm_operands(x, qdtype), bias=x, activation=name, block_size=(16, 16),
                        out_dtype=torch.float32, backend="torch")
    for row in out:
        check_activation(row, x, name)


@pytest.mark.parametrize("qdtype", list(FMTS))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_quantized_gelu_on_the_negative_tail(qdtype, approximate):
    q, s = ops.act_quant(tail_blocks(), dtype=qdtype, backend="torch")
    q2, s2 = ops.quantized_gelu(q, s, approximate=approximate, eps=TAIL_EPS, backend="torch")
    judge_quantized_gelu(q, s, q2, s2, approximate, FMTS[qdtype])
