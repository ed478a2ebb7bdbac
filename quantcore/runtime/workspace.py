"""What the runtime keeps on a device beyond one call: the workspace of the GPU backends' in-launch split-K
reduction (Triton's decode kernel, CuPy's GEMM) and of a float activation quantized once per launch
inside those GEMMs, and the anchor of the prepared runs' output templates (`runtime.launch.allocator`).

Persistent memory and CUDA graphs: no allocation made while a CUDA graph is captured, or while
torch.compile's CUDA-graph trees (`mode="reduce-overhead"`) warm a graph up, may outlive the graph
unless torch owns it (a graph's outputs): the caching allocator then routes every allocation of the
capturing stream or the warming thread into the graph's private pool, and the trees refuse a pool
holding a tensor that is not one of their outputs ("Detected N tensor(s) in the cudagraph pool not
tracked as outputs"). Nothing tells a caller that its allocations go to a pool, so every persistent
buffer here is allocated by `outside_graph_pools`: on a thread of its own, whose allocations no pool
takes (the trees route the warming thread's, a capture its stream's, and that thread's stream is its
device's default one), and never while this thread's stream is being captured (then nothing is
allocated: a launch that needs bigger buffers runs without them). The kept plans made during a
warm-up, the first run of a new shape, therefore hold no pool memory.

A split-K launch writes one fp32 partial tile per (split, output tile) and counts the splits in on
one int32 counter per output tile; the last split sums the partials and sets the counter back to 0.
So the counters are zeroed once, when allocated, and one pair of buffers per device serves every
such launch of both backends: launches on one stream run one after another, and graphs captured on a
side stream replay the buffers they saw. The buffers only grow, at least doubling, and a replaced pair
is kept alive, since a captured graph may still point at it. Zeroing needs a launch that runs now,
which a stream being captured cannot give: there a launch that would need bigger buffers gets none and
must run unsplit.

Concurrent launches on two streams of one device would share the pair and corrupt each other's sums.
A kept plan holds the buffers' addresses and is replayed on whatever stream is current, so keeping a
pair per stream would need the stream in every call's plan key (host time on every call, the hot
path): instead, a program that launches GEMMs from several streams at once sets
QUANTCORE_SHARED_WORKSPACE=0 before its first GEMM (or calls `registry.reset()` after setting it), and
no launch gets the buffers: every GEMM runs unsplit, and decode-sized ones (where K is split, and the
activation quantized once) are slower (docs/runtime.md, "Threads and streams").
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

T = TypeVar("T")
SHARED_ENV = "QUANTCORE_SHARED_WORKSPACE"

_current: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []
_anchors: dict[torch.device, torch.Tensor] = {}
_lock = threading.Lock()
_allocating: list[ThreadPoolExecutor] = []  # the thread that allocates persistent CUDA memory, once started


def outside_graph_pools(make: Callable[[], T], device: torch.device) -> T | None:
    """`make()`, whose CUDA allocations on `device` must outlive any CUDA graph (see the module's
    docstring): run on a thread of its own, its stream synchronized after it (a buffer it zeroes is zero
    before any other stream reads it); None while this thread's current stream is being captured. On other
    devices `make()` here."""
    if device.type != "cuda":
        return make()
    if torch.cuda.is_current_stream_capturing():
        return None

    def made() -> T:
        with torch.cuda.device(device):
            out = make()
            torch.cuda.current_stream(device).synchronize()
        return out
    with _lock:
        if not _allocating:
            _allocating.append(ThreadPoolExecutor(1, thread_name_prefix="quantcore-persistent"))
    return _allocating[0].submit(made).result()


def anchor(device: torch.device) -> torch.Tensor | None:
    """16 bytes on `device` that live as long as the process (the storage of the prepared runs' output
    templates), or None where they cannot be allocated now (a stream being captured)."""
    kept = _anchors.get(device)
    if kept is None:
        kept = outside_graph_pools(lambda: torch.empty(16, dtype=torch.uint8, device=device), device)
        if kept is not None:
            kept = _anchors.setdefault(device, kept)
    return kept


def buffers(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(>= `floats` fp32 partials, >= `tiles` int32 counters, zero between launches) on `device`, or
    None when they would have to grow while the current stream is being captured into a graph, or when
    QUANTCORE_SHARED_WORKSPACE=0 (read when a plan is prepared, never on a kept plan's call)."""
    if os.environ.get(SHARED_ENV) == "0":
        return None
    kept = _current.get(device)
    if kept is not None and kept[0].numel() >= floats and kept[1].numel() >= tiles:
        return kept
    if kept is not None:
        floats, tiles = max(floats, 2 * kept[0].numel()), max(tiles, 2 * kept[1].numel())
    pair = outside_graph_pools(lambda: (torch.empty(floats, dtype=torch.float32, device=device),
                                        torch.zeros(tiles, dtype=torch.int32, device=device)), device)
    if pair is None:
        return None
    if kept is not None:
        _retired.append(kept)
    _current[device] = pair
    return pair


def once_buffers(device: torch.device, floats: int, tiles: int, M: int, K: int, block_k: int) -> tuple | None:
    """The buffers of a launch that reduces `floats` partials over `tiles` counters (0, 0: unsplit) and
    quantizes its float activation of M rows over K once, per 1×block_k group: (partials, counters,
    codes, scales, flags), views of the `buffers` pair, or None where `buffers` gives none. codes:
    uint8 [M · kpad] (row stride kpad = K rounded up to block_k, 128-byte aligned), scales: fp32
    [kpad / block_k, mpad] (K-block-major, mpad = M rounded up to 32, 128-byte aligned: a cache line
    never holds two K blocks' scales, so a program that reads a published block's through L1 caches
    no other block's, which may not be published yet), flags: int32 [kpad / block_k + 1] (one per K
    block, then a count), zero between launches like the counters they follow."""
    kbs, mpad = -(-K // block_k), -(-M // 32) * 32
    scales_at = -(-floats // 32) * 32  # floats: 128-byte aligned
    codes_at = scales_at + kbs * mpad
    pair = buffers(device, codes_at + -(-(M * kbs * block_k) // 4), tiles + kbs + 1)
    if pair is None:
        return None
    ws, counts = pair
    return (ws, counts, ws[codes_at:].view(torch.uint8)[:M * kbs * block_k], ws[scales_at:codes_at],
            counts[tiles:tiles + kbs + 1])


def counters() -> list[torch.Tensor]:
    """Every counter buffer allocated so far (tests check they are back at zero)."""
    return [pair[1] for pair in (*_retired, *_current.values())]


def retire() -> None:
    """Start afresh (tests): the next launch that needs buffers, or a template that needs an anchor, allocates
    them. The buffers are kept alive (a captured graph may point at them); an anchor lives on in the
    templates that view it."""
    _retired.extend(_current.values())
    _current.clear()
    _anchors.clear()
