"""The workspace of the GPU backends' in-launch split-K reduction (Triton's decode kernel, CuPy's GEMM),
and of a float activation quantized once per launch inside those GEMMs.

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
activation quantized once) are slower (docs/architecture.md, "Threads and streams").
"""

from __future__ import annotations

import os

import torch

SHARED_ENV = "QUANTCORE_SHARED_WORKSPACE"

_current: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []


def buffers(device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(>= `floats` fp32 partials, >= `tiles` int32 counters, zero between launches) on `device`, or
    None when they would have to grow while the current stream is being captured into a graph, or when
    QUANTCORE_SHARED_WORKSPACE=0 (read when a plan is prepared, never on a kept plan's call)."""
    if os.environ.get(SHARED_ENV) == "0":
        return None
    kept = _current.get(device)
    if kept is not None and kept[0].numel() >= floats and kept[1].numel() >= tiles:
        return kept
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    if kept is not None:
        _retired.append(kept)
        floats, tiles = max(floats, 2 * kept[0].numel()), max(tiles, 2 * kept[1].numel())
    _current[device] = (torch.empty(floats, dtype=torch.float32, device=device),
                        torch.zeros(tiles, dtype=torch.int32, device=device))
    return _current[device]


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
