"""GPU timing: CUDA events around one call, L2 flushed before each repetition, median of repetitions.

Before each repetition the GPU is also given about a millisecond of sleep, queued ahead of the start
event, so that Python has dispatched the whole timed call before the GPU reaches it: the events then
measure the kernels, not the host (without it, a 10 µs decode GEMM measured its ~100 µs of Python).
Host cost is measured on its own (`host_overhead_us`).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

_FLUSH_BYTES = 256 * 2**20
_HEADSTART_CYCLES = 2_000_000  # ~1 ms at Hopper's clocks: more than any op's host dispatch


def gpu_time_us(fn: Callable[[], object], *, reps: int = 15, warmup: int = 3) -> float:
    """Median GPU time of `fn()` in microseconds (CUDA events, L2 flushed before each rep)."""
    flush = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda._sleep(_HEADSTART_CYCLES)
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


def host_overhead_us(call: Callable[[], object], bare: Callable[[], object], *, n: int = 2000,
                     rounds: int = 5) -> float:
    """Per-call host time of `call` minus that of `bare` (same kernel, launched directly), in µs:
    the best of `rounds` alternating measurements of each, so that a noisy moment of the host
    (a shared machine) cannot land on one side only."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def per_call(fn):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t0) / n * 1e6

    for fn in (call, bare):
        for _ in range(50):
            fn()
    best_call = best_bare = float("inf")
    for _ in range(rounds):
        best_call = min(best_call, per_call(call))
        best_bare = min(best_bare, per_call(bare))
    return best_call - best_bare
