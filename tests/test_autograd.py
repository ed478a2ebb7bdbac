"""Gradients of the differentiable ops (quant_linear: x and bias; scaled_mm with a float output: bias)
against torch autograd of the same function written with the dequantized weight and a
straight-through activation quantization; refusals in the forward for the quantized codes and
scales; the eager path equal to the custom op's; no-grad calls untouched."""

from __future__ import annotations

import pytest
import torch

import quantcore.library
from helpers import DIFFERENTIABLE, TORCH_ACTIVATIONS, outputs_of_every_op_on_grad_inputs, randn, reference_quant_linear
from quantcore import InvalidInputError, ops
from quantcore.definitions.gradients import activation_grad
from quantcore.nn import QuantLinear
from quantcore.definitions.tolerances import GRADIENT, rel_error

qc = torch.ops.quantcore
FP8, INT8 = torch.float8_e4m3fn, torch.int8


def weight(gen, N, K, qdtype, block):
    return ops.weight_quant(randn((N, K), gen=gen), dtype=qdtype, block_size=block)


def grads(y, grad_out, *leaves):
    return torch.autograd.grad(y, leaves, grad_out)


@pytest.mark.parametrize("qdtype", [FP8, INT8])
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_quant_linear_gradients_match_the_dequantized_matmul(gen, qdtype, activation, x_dtype):
    block, (N, K) = (64, 128), (70, 300)  # tails in N and K
    w, ws = weight(gen, N, K, qdtype, block)
    x = randn((2, 3, K), gen=gen, dtype=x_dtype).requires_grad_()
    bias = randn((N,), gen=gen, dtype=torch.bfloat16).requires_grad_()
    y = ops.quant_linear(x, w, ws, bias, activation=activation, out_dtype=torch.float32, block_size=block)
    assert y.requires_grad
    grad_out = randn(tuple(y.shape), gen=gen)
    gx, gb = grads(y, grad_out, x, bias)
    ref_y, rx, rb = reference_quant_linear(x, w, ws, bias, activation, block)
    ex, eb = grads(ref_y, grad_out, rx, rb)
    assert gx.dtype == x_dtype and gb.dtype == torch.bfloat16
    assert rel_error(gx, ex) <= GRADIENT[x_dtype] and rel_error(gb, eb) <= GRADIENT[torch.bfloat16]


@pytest.mark.parametrize("activation", [None, "silu"])
def test_scaled_mm_gives_bias_a_gradient(gen, activation):
    w, ws = weight(gen, 70, 256, FP8, (128, 128))
    a, a_s = ops.act_quant(randn((5, 256), gen=gen))
    bias = randn((70,), gen=gen).requires_grad_()
    y = ops.scaled_mm(a, a_s, w, ws, bias=bias, activation=activation, out_dtype=torch.float32)
    grad_out = randn((5, 70), gen=gen)
    (gb,) = grads(y, grad_out, bias)
    rb = bias.detach().clone().requires_grad_()
    ref = TORCH_ACTIVATIONS[activation](ops.scaled_mm(a, a_s, w, ws, out_dtype=torch.float32) + rb)
    (eb,) = grads(ref, grad_out, rb)
    assert rel_error(gb, eb) <= GRADIENT[torch.float32]


def test_eager_gradients_are_the_custom_ops(gen):
    w, ws = weight(gen, 40, 200, INT8, (128, 128))
    x = randn((6, 200), gen=gen, dtype=torch.bfloat16).requires_grad_()
    bias = randn((40,), gen=gen).requires_grad_()
    grad_out = randn((6, 40), gen=gen, dtype=torch.bfloat16)
    eager = grads(ops.quant_linear(x, w, ws, bias, activation="gelu", backend=("torch",)), grad_out, x, bias)
    custom = grads(qc.quant_linear(x, w, ws, bias, activation="gelu", backend="torch"), grad_out, x, bias)
    assert all(torch.equal(a, b) for a, b in zip(eager, custom))


def test_the_custom_op_differentiates_with_its_options_at_their_defaults_and_no_bias(gen):
    """The dispatcher hands a Python kernel only the arguments given: the gradient still gets every option."""
    w, ws = weight(gen, 40, 200, INT8, (128, 128))
    x = randn((3, 200), gen=gen).requires_grad_()
    grad_out = randn((3, 40), gen=gen, dtype=torch.bfloat16)
    (gx,) = grads(qc.quant_linear(x, w, ws), grad_out, x)
    ref_y, rx, _ = reference_quant_linear(x, w, ws, None, None, (128, 128))
    (ex,) = grads(ref_y, grad_out.float(), rx)
    assert gx.dtype == torch.float32 and rel_error(gx, ex) <= GRADIENT[torch.float32]


def test_a_priority_list_keeps_falling_back_on_the_gradient_path(gen):
    w, ws = weight(gen, 40, 200, INT8, (128, 128))
    x = randn((3, 200), gen=gen).requires_grad_()
    y = ops.quant_linear(x, w, ws, backend=("cupy",))  # no CuPy kernel runs on the CPU: the reference does
    assert y.requires_grad and torch.equal(y, ops.quant_linear(x.detach(), w, ws, backend="torch"))


def test_forward_is_unchanged_by_grad_mode(gen):
    w, ws = weight(gen, 40, 200, FP8, (128, 128))
    x = randn((3, 200), gen=gen)
    with torch.no_grad():
        plain = ops.quant_linear(x, w, ws, activation="silu")
    assert torch.equal(ops.quant_linear(x.requires_grad_(), w, ws, activation="silu"), plain)


def test_activation_derivatives_match_torch_autograd():
    x = torch.linspace(-12, 12, 20001, dtype=torch.float64).requires_grad_()
    for name in ("gelu", "gelu_tanh", "silu"):
        (exact,) = torch.autograd.grad(TORCH_ACTIVATIONS[name](x).sum(), x)
        got = activation_grad(x.detach().float(), name)
        assert (got.double() - exact).abs().max() <= 1e-6, name


@pytest.mark.parametrize("path", ["eager", "custom op"])
def test_codes_and_scales_requiring_grad_are_refused_in_the_forward(gen, path):
    w, ws = weight(gen, 40, 200, FP8, (128, 128))
    x = randn((3, 200), gen=gen).requires_grad_()
    a, a_s = ops.act_quant(x.detach())
    linear = ops.quant_linear if path == "eager" else qc.quant_linear
    mm = ops.scaled_mm if path == "eager" else qc.scaled_mm
    with pytest.raises(InvalidInputError, match=r"quant_linear: w_scale requires grad.*only x and bias"):
        linear(x, w, ws.clone().requires_grad_())
    with pytest.raises(InvalidInputError, match=r"scaled_mm: a_scale and b_scale require grad.*only bias.*quant_linear"):
        mm(a, a_s.clone().requires_grad_(), w, ws.clone().requires_grad_())
    with torch.no_grad():  # no graph is recorded: nothing to refuse
        linear(x, w, ws.clone().requires_grad_())


def test_inference_calls_never_reach_the_autograd_path(gen, monkeypatch):
    def refuse(*args):
        raise AssertionError("ran through the custom op")

    monkeypatch.setattr(quantcore.library, "call_with_gradient", refuse)
    w, ws = weight(gen, 40, 200, FP8, (128, 128))
    x = randn((3, 200), gen=gen)
    assert not ops.quant_linear(x, w, ws).requires_grad  # grad mode on, no input requiring grad
    with torch.no_grad():
        assert not ops.quant_linear(x.requires_grad_(), w, ws).requires_grad
    with torch.inference_mode():
        assert not ops.quant_linear(x, w, ws).requires_grad


def test_quant_linear_layer_trains_its_input(gen):
    linear = torch.nn.Linear(300, 70).requires_grad_(False)
    layer = QuantLinear.from_linear(linear, dtype=FP8, out_dtype=torch.float32)
    x = randn((4, 300), gen=gen).requires_grad_()
    grad_out = randn((4, 70), gen=gen)
    (gx,) = grads(layer(x), grad_out, x)
    ref_y, rx, _ = reference_quant_linear(x, layer.weight, layer.weight_scale_inv, layer.bias, None, (128, 128))
    (ex,) = grads(ref_y, grad_out, rx)
    assert rel_error(gx, ex) <= GRADIENT[torch.float32]


def test_only_the_differentiable_ops_outputs_require_grad():
    """Every other op is a conversion: its outputs never require grad, as a cast to an integer dtype's
    do not, eagerly and as a custom op."""
    for op, tensors in outputs_of_every_op_on_grad_inputs("torch").items():
        assert [t.requires_grad for t in tensors] == [op in DIFFERENTIABLE] * len(tensors), op
    x = randn((3, 300), gen=torch.Generator().manual_seed(0)).requires_grad_()
    q, s = qc.act_quant(x)
    assert not q.requires_grad and not s.requires_grad
    assert not qc.act_dequant(q, s.detach().requires_grad_()).requires_grad
