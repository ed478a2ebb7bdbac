"""The read ceiling of a decode GEMM: the GPU time of one kernel that only reads as many bytes.

The memory floor (bytes / copy rate) is the limit of a long stream. A decode GEMM of 15 MB is one
launch of ~10 µs, where the launch, the first DRAM latencies and the last programs' tail are a large
share of the time, and no kernel of that size reaches the floor: on the H100 a kernel that does
nothing but read 15 MiB took 9.2 µs against a 5.2 µs floor (docs/performance.md). Timing such a
kernel on the same timer gives the GEMM a ceiling it could actually reach.

Imported only by the bench on a CUDA machine (Triton is then present).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import timing

# (programs per SM, elements per load, warps): the fastest of these for each size is the ceiling.
_CONFIGS = ((1, 4096, 8), (2, 4096, 8), (2, 1024, 4), (4, 1024, 4))


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], tl.int32)
    for i in tl.range(0, per_program, BLOCK, num_stages=4):
        offs = start + i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


@functools.lru_cache(maxsize=None)
def read_us(nbytes: int, device: str = "cuda") -> float:
    """GPU time (µs, `timing.gpu_time_us`) of the fastest one-kernel read of `nbytes` bytes."""
    n = max(1, nbytes // 4)
    x = torch.ones(n, dtype=torch.int32, device=device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.empty(4 * sms, dtype=torch.int32, device=device)
    best = float("inf")
    for per_sm, block, warps in _CONFIGS:
        programs = per_sm * sms
        per_program = triton.cdiv(triton.cdiv(n, programs), block) * block
        grid = (triton.cdiv(n, per_program),)
        best = min(best, timing.gpu_time_us(
            lambda: _read_kernel[grid](x, out, n, per_program, BLOCK=block, num_warps=warps)))
    return best
