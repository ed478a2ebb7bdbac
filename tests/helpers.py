"""Test helpers: random inputs."""

from __future__ import annotations

import torch


def randn(shape, dtype=torch.float32, gen=None, scale=1.0, device="cpu"):
    """Random normal values with per-row spread, so blocks get different scales."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    if len(shape) >= 1 and x.numel():
        x = x * torch.exp(torch.randn(*shape[:-1], 1, generator=gen)) * scale
    return x.to(dtype).to(device)


def outputs_of_every_op_on_grad_inputs(backend: str) -> dict[str, tuple]:
    """Every op run on `backend` with each float input (values, scales, bias) requiring grad; the
    outputs per op, as tuples. Small shapes with tails, so the Triton interpreter is quick too."""
    from quantcore import ops

    gen = torch.Generator().manual_seed(7)
    x = randn((3, 40), gen=gen).requires_grad_()
    w = randn((24, 40), gen=gen).requires_grad_()
    q, s = ops.act_quant(x.detach(), dtype=torch.int8, group_size=16, backend=backend)
    wq, ws = ops.weight_quant(w.detach(), dtype=torch.int8, block_size=(16, 16), backend=backend)
    s, ws = s.clone().requires_grad_(), ws.clone().requires_grad_()
    bias = randn((24,), gen=gen).requires_grad_()
    mm = dict(block_size=(16, 16), bias=bias, activation="gelu", backend=backend)
    out = {
        "act_quant": ops.act_quant(x, dtype=torch.int8, group_size=16, backend=backend),
        "act_dequant": ops.act_dequant(q, s, group_size=16, backend=backend),
        "weight_quant": ops.weight_quant(w, block_size=(16, 16), backend=backend),
        "weight_dequant": ops.weight_dequant(wq, ws, block_size=(16, 16), backend=backend),
        "scaled_mm": ops.scaled_mm(q, s, wq, ws, out_dtype=torch.float32, **mm),
        "scaled_mm+requant": ops.scaled_mm(q, s, wq, ws, out_quant=torch.int8, out_group_size=16, **mm),
        "dequant_bias": ops.dequant_bias(x[:, :24], s[:, 0], bias, bias, backend=backend),
        "quantized_gelu": ops.quantized_gelu(q, s, group_size=16, backend=backend),
    }
    return {op: o if isinstance(o, tuple) else (o,) for op, o in out.items()}
