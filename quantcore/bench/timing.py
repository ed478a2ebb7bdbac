"""GPU timing: CUDA events around one call, L2 flushed before each repetition, median of repetitions.

The flush reads a 256 MiB buffer, leaving L2 full of clean lines. Writing it instead (as a `zero_()`
does) leaves ~50 MB of dirty lines whose write-back the timed kernel would pay as it evicts them: on
the H100 that added 1.7 µs to a 15 MB decode GEMM and 8.6 µs to a 117 MB one, and 3.7 µs to a
16 MiB copy — traffic that no real caller's kernel sees.

Before each repetition the GPU is also given about a millisecond of sleep, queued ahead of the start
event, so that Python has dispatched the whole timed call before the GPU reaches it: the events then
measure the kernels, not the host (without it, a 10 µs decode GEMM measured its ~100 µs of Python).
Host cost is measured on its own: `eager_time_us` (back-to-back calls, host and GPU together) and
`host_overhead_us` (quantcore's dispatch against a direct call).

Implementations compared with each other are timed interleaved (`gpu_times_us`, `eager_times_us`):
each repetition times every one of them once, starting from a different one each time. Timed one
after the other, a call's time depended on when it ran: the same cuBLAS kernel measured 0.84-1.03× of
itself on the large GEMMs, timed first as the vendor baseline and again late,
after the other implementations' loops, through quantcore's `torch[cublas]` variant. Large GEMMs run
the H100 at its 700 W power cap, where its clock moves between 1230 and 1980 MHz; interleaved, the two
measure 0.98-1.02 of each other.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

_FLUSH_BYTES = 256 * 2**20
_HEADSTART_CYCLES = 2_000_000  # ~1 ms at Hopper's clocks: more than any op's host dispatch


def gpu_time_us(fn: Callable[[], object], *, reps: int = 15, warmup: int = 3) -> float:
    """Median GPU time of `fn()` in microseconds (CUDA events, L2 flushed before each rep)."""
    return gpu_times_us([fn], reps=reps, warmup=warmup)[0]


def gpu_times_us(fns: Sequence[Callable[[], object]], *, reps: int = 15, warmup: int = 3) -> list[float]:
    """Median GPU time in microseconds of each of `fns`, timed interleaved: each of the `reps`
    repetitions times every fn once (L2 flushed and the GPU given its head start before each), the
    first of them rotating from one repetition to the next, so that no fn always follows the same one."""
    flush = torch.zeros(_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for rep in range(reps):
        for i in _rotated(len(fns), rep):
            flush.sum()
            torch.cuda._sleep(_HEADSTART_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[i]()
            end.record()
            torch.cuda.synchronize()
            times[i].append(start.elapsed_time(end) * 1e3)
    return [statistics.median(t) for t in times]


def _rotated(n: int, shift: int) -> list[int]:
    """0 … n-1 starting from `shift` mod n."""
    return [(shift + i) % n for i in range(n)]


def copy_bandwidth_gbps(nbytes: int = 2**30) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written: the memory-bound ceiling."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = gpu_time_us(lambda: dst.copy_(src), reps=10)
    return 2 * nbytes / us / 1e3


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def loop_us(fn: Callable[[], object], n: int) -> float:
    """Host-clock time per call of `n` back-to-back calls of `fn`, in µs, with one synchronize before
    and one after the loop: what a Python loop of these calls costs, host and GPU together."""
    _synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    _synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def eager_time_us(fn: Callable[[], object], *, n: int = 200, warmup: int = 20, budget_s: float = 0.1) -> float:
    """Eager time per call of `fn` in µs: `loop_us` of n calls after `warmup` calls, no sleep, so the
    larger of the host's and the GPU's cost per call is what is measured (what an eager decode loop pays).

    Where one call is long, fewer calls are made (at least one), keeping the loop within about
    `budget_s`: a long call is GPU-bound, and its time per call does not need 200 samples."""
    one = loop_us(fn, 1)  # a synchronized call: an upper bound on the cost of one in the loop
    reps = max(1, min(n, int(budget_s * 1e6 / max(one, 1e-3))))
    loop_us(fn, min(warmup, reps))
    return loop_us(fn, reps)


def eager_times_us(fns: Sequence[Callable[[], object]], *, rounds: int = 3, budget_s: float = 0.1) -> list[float]:
    """`eager_time_us` of each of `fns`, interleaved: `rounds` rounds, each timing every fn once in an
    order rotating from round to round (each loop within `budget_s / rounds`); the median round per fn."""
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for i in _rotated(len(fns), r):
            times[i].append(eager_time_us(fns[i], budget_s=budget_s / rounds))
    return [statistics.median(t) for t in times]


def host_overhead_us(call: Callable[[], object], bare: Callable[[], object], *, n: int = 2000,
                     rounds: int = 5) -> float:
    """Per-call host time of `call` minus that of `bare` (same kernel, launched directly), in µs:
    the best of `rounds` alternating measurements of each, so that a noisy moment of the host
    (a shared machine) cannot land on one side only."""
    for fn in (call, bare):
        for _ in range(50):
            fn()
    best_call = best_bare = float("inf")
    for _ in range(rounds):
        best_call = min(best_call, loop_us(call, n))
        best_bare = min(best_bare, loop_us(bare, n))
    return best_call - best_bare
