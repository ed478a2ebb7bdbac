"""GPU timing: CUDA events around one call, L2 flushed before each repetition, median of repetitions.

The flush (a 256 MiB memset) also keeps the GPU busy while Python dispatches the timed call, so the
events measure the kernel(s), not the host.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

_FLUSH_BYTES = 256 * 2**20


def gpu_time_us(fn: Callable[[], object], *, reps: int = 20, warmup: int = 3) -> float:
    """Median GPU time of `fn()` in microseconds (CUDA events, L2 flushed before each rep)."""
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbps(nbytes: int = 2**30) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written: the memory-bound ceiling."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = gpu_time_us(lambda: dst.copy_(src), reps=10)
    return 2 * nbytes / us / 1e3


def host_overhead_us(call: Callable[[], object], bare: Callable[[], object], *, n: int = 2000) -> float:
    """Per-call host time of `call` minus that of `bare` (same kernel, launched directly), in µs."""
    def per_call(fn):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6
    return per_call(call) - per_call(bare)
