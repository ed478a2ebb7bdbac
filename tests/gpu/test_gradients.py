"""Input gradients of quant_linear on the GPU, on every backend that runs it, against torch autograd
of the straight-through float function on the same GPU; and a LoRA-style training step compiled with
Inductor equal to the eager one.

Run on a GPU machine: `python3 -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import pytest
import torch

from helpers import reference_quant_linear
from quantcore import UnsupportedError, ops, registry
from quantcore.definitions.tolerances import GRADIENT, rel_error

pytestmark = pytest.mark.gpu


def rand(shape, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


@pytest.mark.parametrize("backend", [None, *registry.compared("quant_linear")])
@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("m", [1, 64, 1000])
def test_quant_linear_input_gradients(backend, qdtype, m):
    N, K = 2112, 7168
    w, ws = ops.weight_quant(rand((N, K), 1, 0.02), dtype=qdtype)
    x, bias = rand((m, K), 2).requires_grad_(), rand((N,), 3).requires_grad_()
    try:
        y = ops.quant_linear(x, w, ws, bias, activation="silu", backend=backend)
    except UnsupportedError as err:
        pytest.skip(f"{backend}: {err.reasons}")
    grad_out = rand((m, N), 4)
    gx, gb = torch.autograd.grad(y, (x, bias), grad_out)
    ref, rx, rb = reference_quant_linear(x, w, ws, bias, "silu", (128, 128))
    ex, eb = torch.autograd.grad(ref, (rx, rb), grad_out.float())
    assert gx.dtype == gb.dtype == torch.bfloat16 and not gx.isnan().any()
    assert rel_error(gx, ex) <= GRADIENT[torch.bfloat16] and rel_error(gb, eb) <= GRADIENT[torch.bfloat16]


def test_compiled_lora_step_matches_eager():
    """A frozen FP8 layer plus a trainable low-rank update: gradients for the input and the adapter."""
    w, ws = ops.weight_quant(rand((1024, 2048), 5, 0.02))
    down, up = rand((16, 2048), 6, 0.02).requires_grad_(), rand((1024, 16), 7, 0.02).requires_grad_()

    def loss(x):
        y = torch.ops.quantcore.quant_linear(x, w, ws, None, activation="gelu") + (x @ down.t()) @ up.t()
        return y.float().square().mean()

    x = rand((64, 2048), 8).requires_grad_()
    eager = torch.autograd.grad(loss(x), (x, down, up))
    compiled = torch.autograd.grad(torch.compile(loss, fullgraph=True)(x), (x, down, up))
    for got, want in zip(compiled, eager):
        assert rel_error(got, want) <= GRADIENT[torch.bfloat16]
