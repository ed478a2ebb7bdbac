"""Launch functions of the mixture-of-experts routing ops on the CuPy backend (`kernels/routing.cu`): the
permutes (count, scan, scatter with the activation quantized once per token) and the un-permute (invert
the rows map, gather and sum). `prepared` as `launch.py`'s functions: the plan fixes grids, shared memory
and the kernels' constant arguments; a run allocates its outputs and workspaces and launches, reading the
routing on the device only (no host synchronization, so a CUDA graph holds it).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

from ...runtime.launch import allocator, by_address, compose, prepared
from .launch import _CTYPE, _QTYPE, _kernel
from .launcher import POINTER, Launcher, f32, i32, i64

_THREADS = 256  # kRouteThreads in routing.cu
_ID_TYPE = {torch.int32: "int", torch.int64: "long long"}
_I32 = torch.int32
# Tokens a chunk of the sort holds: its pairs are what the scatter's threads scan to rank one pair (at most
# `_CHUNK_PAIRS`), and the chunks' count is the scan's loop (fewer, longer chunks make it shorter).
_CHUNK_PAIRS = 256


def _sequence(params: str, outputs: dict[str, Callable[[], torch.Tensor]],
              steps: list[tuple[Launcher, tuple[str, ...]]], result: str) -> Callable[..., Any]:
    """A prepared run (`runtime.launch.compose`) making `outputs` (results and workspaces) and launching each
    step's kernel on the addresses of the tensors it names, in order; described for the native path."""
    body = "".join(f"    _step{i}({', '.join(f'{n}.data_ptr()' for n in names)})\n"
                   for i, (_, names) in enumerate(steps))
    return compose(params, outputs, body, {f"_step{i}": launcher for i, (launcher, _) in enumerate(steps)}, result,
                   lambda: [one for launcher, names in steps for one in launcher.native(names)])


def _permute(x, topk_ids, *, num_experts, max_m, qdtype, group_size, ue8m0, eps, profile):
    """Both permutes of the backend contract (docs/backend-contract.md): max_m None for `moe_permute`'s
    contiguous rows, the slabs' rows for `moe_permute_masked`."""
    (T, H), k, E, device = x.shape, topk_ids.shape[1], num_experts, x.device
    masked = max_m is not None
    slots, groups = (E * max_m if masked else T * k), math.ceil(H / group_size)
    tokens = max(1, _CHUNK_PAIRS // k)
    chunks = math.ceil(T / tokens)
    lead = (E, max_m) if masked else (slots,)
    outputs = {"_q": allocator((*lead, H), qdtype, device), "_scale": allocator((*lead, groups), torch.float32, device),
               "_bounds": allocator((E if masked else E + 1,), _I32, device), "_rows": allocator(lead, _I32, device),
               "_firsts": allocator((chunks, E), _I32, device)}
    ids = _ID_TYPE[topk_ids.dtype]
    st, sj = topk_ids.stride()
    count = _kernel("routing.cu", f"qc::moe_count_kernel<{ids}>", profile, device, (chunks,), (_THREADS,),
                    (POINTER, POINTER, i64(st), i64(sj), i32(T), i32(k), i32(E), i32(tokens)))
    scan = _kernel("routing.cu", "qc::moe_scan_kernel", profile, device, (1,), (_THREADS,),
                   (POINTER, POINTER, i32(chunks), i32(E), i32(max_m or 0), i32(masked)), 4 * E)
    scatter = _kernel("routing.cu", f"qc::moe_scatter_kernel<{_CTYPE[x.dtype]}, {_QTYPE[qdtype]}, {ids}>", profile,
                      device, (T + math.ceil(slots / _THREADS),), (_THREADS,),
                      (*(POINTER,) * 7, i64(x.stride(0)), i64(st), i64(sj), i32(T), i32(H), i32(k), i32(E),
                       i32(tokens), i64(slots), i32(max_m or 0), i32(group_size), f32(eps), i32(bool(ue8m0)),
                       i32(masked)), 8 * k)
    run = _sequence("x, topk_ids", outputs, [
        (count, ("topk_ids", "_firsts")), (scan, ("_firsts", "_bounds")),
        (scatter, ("x", "topk_ids", "_firsts", "_bounds", "_q", "_scale", "_rows"))], "_q, _scale, _bounds, _rows")
    return by_address(run)


moe_permute_masked = prepared(_permute)  # the masked layout's permute takes max_m, the contiguous one's not
moe_permute = prepared(functools.partial(_permute, max_m=None))


@prepared
def moe_unpermute(y, rows, topk_weights, *, out_dtype, profile):
    """The contract's `moe_unpermute` (docs/backend-contract.md) in two CUDA launches: the rows map inverted
    into each pair's source row, then a block per (token, 256 columns) summing its k products."""
    (R, N), (T, k), device = y.shape, topk_weights.shape, y.device
    outputs = {"_out": allocator((T, N), out_dtype, device), "_sources": allocator((T * k,), _I32, device)}
    invert = _kernel("routing.cu", "qc::moe_invert_kernel", profile, device, (math.ceil(R / _THREADS),), (_THREADS,),
                     (POINTER, POINTER, i64(R), i64(T * k)))
    gather = _kernel("routing.cu", f"qc::moe_gather_kernel<{_CTYPE[y.dtype]}, {_CTYPE[topk_weights.dtype]}, "
                     f"{_CTYPE[out_dtype]}>", profile, device, (T, math.ceil(N / _THREADS)), (_THREADS,),
                     (*(POINTER,) * 5, i64(y.stride(0)), i64(topk_weights.stride(0)), i64(topk_weights.stride(1)),
                      i64(N), i32(N), i32(k), i64(R)))
    run = _sequence("y, rows, topk_weights", outputs, [
        (invert, ("rows", "_sources")), (gather, ("y", "rows", "_sources", "topk_weights", "_out"))], "_out")
    return by_address(run)
