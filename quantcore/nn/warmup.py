"""`quantcore.warmup`: what a server does before its first request, so that no request pays a compile.

A first call at a new number of rows M compiles the Triton kernels that M selects (several of their
constants follow M: the decode GEMM's row tile and quantized rows, the quantizers' rows per program,
whether M divides into them evenly, M == 1 and M % 16 == 0), 1-2 s a batch size on an empty Triton
cache; and the first CUDA plan of a process loads quantcore's native launch path or, on an empty
quantcore cache, starts building it in the background (`runtime.native`). `warmup` does both ahead.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..definitions import checks
from ..errors import InvalidInputError
from ..runtime import native
from .experts import QuantExperts
from .layers import QuantLinear

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def warmup(model: nn.Module, batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES, *, dtype: torch.dtype = torch.bfloat16,
           inputs: Callable[[int], Any] | None = None, wait_native: bool = True, top_k: int = 8) -> dict[int, float]:
    """Compile and plan ahead what `model`'s first forward at each of `batch_sizes` rows would, and return
    the seconds each batch size took.

    Without `inputs`, each distinct `QuantLinear` of the model (by shapes, formats and device: equal
    layers share their kernels and plans) runs on random `dtype` rows [M, in_features], and each distinct
    `QuantExperts` on M random tokens routed to `top_k` experts each (the model's num_experts_per_tok:
    M·top_k picks the layout and the grouped GEMMs' rows); the model's own
    input shapes (a decode step's [B, 1, K]) then still make their plans on their first call, a few
    milliseconds with every kernel compiled. With `inputs`, `model(*inputs(M))` (or `model(**inputs(M))`
    for a dict) runs instead, under `torch.no_grad()`: every kernel and plan of those calls. `wait_native`:
    on a GPU, also wait for the native launch path to be loaded or built, so that the first request
    replays its plans in C++ (QUANTCORE_NATIVE=0 leaves it off).
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"warmup: expected an nn.Module, got {type(model).__name__}")
    sizes = [checks.positive_int("warmup", "batch_sizes[i]", m) for m in batch_sizes]
    checks.positive_int("warmup", "top_k", top_k)
    layers = {_kind(layer): layer for layer in model.modules() if isinstance(layer, QuantLinear)}
    experts = {(layer.extra_repr(), layer.gate_up_proj.device): layer for layer in model.modules()
               if isinstance(layer, QuantExperts)}
    cuda = any(p.is_cuda for p in (*(layer.weight for layer in layers.values()),
                                   *(layer.gate_up_proj for layer in experts.values())))
    # Loaded from the cache, or its build started to run beside the kernels' compiles below.
    building = cuda and wait_native and native.enabled() and native.module() is None

    def run(m: int) -> None:
        if inputs is not None:
            given = inputs(m)
            model(**given) if isinstance(given, dict) else model(*given)
        for layer in layers.values() if inputs is None else ():
            x = torch.randn(m, layer.in_features, dtype=dtype, device=layer.weight.device)
            layer._gemm(x, layer._parameters["bias"], layer.out_dtype or dtype)
        for layer in experts.values() if inputs is None else ():
            device, k = layer.gate_up_proj.device, min(top_k, layer.num_experts)
            # Token t routed to experts t·k … t·k + k - 1 (mod E): distinct per token, spread over all of them;
            # int64 ids as torch.topk gives them, weights in the activations' dtype (their dtypes pick kernels).
            ids = torch.arange(m * k, device=device).view(m, k) % layer.num_experts
            layer(torch.randn(m, layer.hidden_size, dtype=dtype, device=device), ids,
                  torch.full((m, k), 1 / k, dtype=dtype, device=device))
        if cuda:
            torch.cuda.synchronize()

    seconds = {}
    with torch.no_grad():
        for m in sizes:
            start = time.perf_counter()
            run(m)
            seconds[m] = time.perf_counter() - start
        # A build that ends invalidates the plans kept meanwhile (Python runs): made again, they replay natively.
        if building and native.wait() and native.module() is not None:
            for m in sizes:
                run(m)
    return seconds


def _kind(layer: QuantLinear) -> tuple:
    """What a layer's kernels and plans depend on besides the input."""
    bias = layer._parameters["bias"]
    return (layer.in_features, layer.out_features, layer.weight.dtype, layer.block_size, layer.scale_fmt,
            layer.out_dtype, layer.weight.device, None if bias is None else bias.dtype)
