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
from .layers import QuantLinear

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


def warmup(model: nn.Module, batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES, *, dtype: torch.dtype = torch.bfloat16,
           inputs: Callable[[int], Any] | None = None, wait_native: bool = True) -> dict[int, float]:
    """Compile and plan ahead what `model`'s first forward at each of `batch_sizes` rows would, and return
    the seconds each batch size took.

    Without `inputs`, each distinct `QuantLinear` of the model (by shapes, formats and device: equal
    layers share their kernels and plans) runs on random `dtype` rows [M, in_features]; the model's own
    input shapes (a decode step's [B, 1, K]) then still make their plans on their first call, a few
    milliseconds with every kernel compiled. With `inputs`, `model(*inputs(M))` (or `model(**inputs(M))`
    for a dict) runs instead, under `torch.no_grad()`: every kernel and plan of those calls. `wait_native`:
    on a GPU, also wait for the native launch path to be loaded or built, so that the first request
    replays its plans in C++ (QUANTCORE_NATIVE=0 leaves it off).
    """
    if not isinstance(model, nn.Module):
        raise InvalidInputError(f"warmup: expected an nn.Module, got {type(model).__name__}")
    sizes = [checks.positive_int("warmup", "batch_sizes[i]", m) for m in batch_sizes]
    layers = {_kind(layer): layer for layer in model.modules() if isinstance(layer, QuantLinear)}
    cuda = any(layer.weight.is_cuda for layer in layers.values())
    # Loaded from the cache, or its build started to run beside the kernels' compiles below.
    building = cuda and wait_native and native.enabled() and native.module() is None

    def run(m: int) -> None:
        if inputs is not None:
            given = inputs(m)
            model(**given) if isinstance(given, dict) else model(*given)
        for layer in layers.values() if inputs is None else ():
            x = torch.randn(m, layer.in_features, dtype=dtype, device=layer.weight.device)
            layer._gemm(x, layer._parameters["bias"], layer.out_dtype or dtype)
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
