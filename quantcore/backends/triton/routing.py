"""Launch functions of the mixture-of-experts routing ops on Triton (`kernels/routing.py`): the permutes
(three launches: count, scan, scatter with the fused quantization) and the un-permute (two: invert the
rows map, gather and sum). Each is `prepared` as `launch.py`'s functions: the plan fixes tiles, grids and
constants; a run allocates its outputs and workspaces and launches, reading the routing on the device
only (no host synchronization, so a CUDA graph holds it).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import triton

from ...runtime.launch import allocator, by_address, compose, prepared
from .direct import Launcher
from .kernels.quant import scales_may_be_tiny
from .kernels.routing import (moe_count_kernel, moe_gather_kernel, moe_invert_kernel, moe_scan_kernel,
                              moe_scatter_kernel)
from .launch import _KIND, _hw_fp8

_I32 = torch.int32
# Register budgets (elements a program holds): the count kernel's one-hot [pairs, E_PAD] and the scatter's
# pairwise ranks [pairs, pairs] up to 2^14, its quantized tile [tokens, groups, group] up to 2^12 (the
# dense quantizer's tile, `configs.block_tiling`).
_ONE_HOT, _PAIRS, _TILE = 1 << 14, 128, 1 << 12
_FILL = 1024  # rows an extra scatter program marks -1
_GATHER_N = 1024  # output columns a gather program sums


def _sequence(params: str, outputs: dict[str, Callable[[], torch.Tensor]],
              steps: list[tuple[Launcher, tuple[str, ...]]], result: str) -> Callable[..., Any]:
    """A prepared run (`runtime.launch.compose`) making `outputs` (results and workspaces) and launching each
    step's kernel on the tensors it names, in order; described for the native path once every launch is."""
    body = "".join(f"    _step{i}({', '.join(names)})\n" for i, (_, names) in enumerate(steps))

    def launches():
        got = [launcher.native(names) for launcher, names in steps]
        if any(g is False for g in got):
            return False
        return None if any(g is None for g in got) else [one for g in got for one in g]
    return compose(params, outputs, body, {f"_step{i}": launcher for i, (launcher, _) in enumerate(steps)}, result,
                   launches)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def _permute(x, topk_ids, *, num_experts, max_m, qdtype, group_size, ue8m0, eps, profile):
    """Both permutes of the backend contract (docs/backend-contract.md): max_m None for `moe_permute`'s
    contiguous rows, the slabs' rows for `moe_permute_masked`."""
    (T, H), k, E = x.shape, topk_ids.shape[1], num_experts
    masked = max_m is not None
    slots, groups = (E * max_m if masked else T * k), triton.cdiv(H, group_size)
    kp, e_pad, g_pad = _pow2(k), _pow2(E), _pow2(group_size)
    # Tokens a chunk holds: the pairs within the one-hot's and the ranks' budgets, the rows within the tile's.
    tokens = min(max(1, min(_PAIRS, _ONE_HOT // e_pad) // kp), max(1, _TILE // g_pad), _pow2(T))
    tokens = 1 << (tokens.bit_length() - 1)
    cb = max(1, min(_pow2(groups), _TILE // (tokens * g_pad)))
    chunks = triton.cdiv(T, tokens)
    lead = (E, max_m) if masked else (slots,)
    device = x.device
    outputs = {"_q": allocator((*lead, H), qdtype, device), "_scale": allocator((*lead, groups), torch.float32, device),
               "_bounds": allocator((E if masked else E + 1,), _I32, device), "_rows": allocator(lead, _I32, device),
               "_firsts": allocator((chunks, E), _I32, device)}
    pairs = dict(K_TOP=k, TOKENS=tokens, KP=kp)
    ids = (T, E, topk_ids.stride(0), topk_ids.stride(1))
    count = Launcher(moe_count_kernel, (chunks,), dict(**pairs, E_PAD=e_pad), x.device, fixed=ids)
    scan = Launcher(moe_scan_kernel, (1,), dict(MASKED=masked, P_BLOCK=max(1, min(_pow2(chunks), _ONE_HOT // e_pad)),
                                                E_PAD=e_pad), x.device, fixed=(chunks, E, max_m or 0))
    scatter = Launcher(moe_scatter_kernel, (chunks + triton.cdiv(slots, _FILL),), dict(
        MASKED=masked, **pairs, GROUP=group_size, G_PAD=g_pad, CB=cb, FILL=_FILL, SRC=_KIND[x.dtype],
        QFMT=_KIND[qdtype], UE8M0=bool(ue8m0), HW_FP8=_hw_fp8(profile), TINY_SCALES=scales_may_be_tiny(eps, qdtype)),
        x.device, fixed=(T, H, E, chunks, slots, max_m or 0, x.stride(0), topk_ids.stride(0), topk_ids.stride(1), eps))
    run = _sequence("x, topk_ids", outputs, [
        (count, ("topk_ids", "_firsts")), (scan, ("_firsts", "_bounds")),
        (scatter, ("x", "topk_ids", "_firsts", "_bounds", "_q", "_scale", "_rows"))], "_q, _scale, _bounds, _rows")
    return by_address(run)


moe_permute_masked = prepared(_permute)  # the masked layout's permute takes max_m, the contiguous one's not
moe_permute = prepared(functools.partial(_permute, max_m=None))


@prepared
def moe_unpermute(y, rows, topk_weights, *, out_dtype, profile):
    """The contract's `moe_unpermute` (docs/backend-contract.md) in two Triton launches: the rows map inverted
    into each pair's source row, then one program per (token, up to 1024 columns) summing its k products."""
    (R, N), (T, k) = y.shape, topk_weights.shape
    outputs = {"_out": allocator((T, N), out_dtype, y.device), "_sources": allocator((T * k,), _I32, y.device)}
    invert = Launcher(moe_invert_kernel, (triton.cdiv(R, _FILL),), dict(BLOCK=_FILL), y.device, fixed=(R, T * k))
    block_n = min(_GATHER_N, _pow2(N))
    gather = Launcher(moe_gather_kernel, (T, triton.cdiv(N, block_n)), dict(
        K_TOP=k, BLOCK_N=block_n, YKIND=_KIND[y.dtype], WKIND=_KIND[topk_weights.dtype], OUT=_KIND[out_dtype],
        enable_fp_fusion=False), y.device,
        fixed=(N, R, y.stride(0), topk_weights.stride(0), topk_weights.stride(1), N))
    run = _sequence("y, rows, topk_weights", outputs, [
        (invert, ("rows", "_sources")), (gather, ("y", "rows", "_sources", "topk_weights", "_out"))], "_out")
    return by_address(run)
