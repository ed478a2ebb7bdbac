"""FP8 block-quantized weights converted to INT8 blocks, with the error the conversion makes.

On GPUs without FP8 tensor cores (sm_80, sm_86) an FP8 GEMM decodes FP8 to fp16 for fp16 MMA, while
the INT8 GEMM runs at cuBLAS speed; an FP8 checkpoint (DeepSeek-V3's `weight`, `weight_scale_inv`)
converted once, at load time, runs the INT8 kernels there. INT8 changes the numerics: each block's
uniform grid of 255 steps replaces FP8's floating one, so values far below their block's amax lose
digits or become 0. The conversion is therefore an explicit call that returns how far the INT8 weight
is from the FP8 one (`RequantError`), for the caller to report or to refuse.

Each block is re-quantized from its exact dequantized values v = q·s (in float64, where an e4m3 value
times an fp32 scale is exact) with the contract's INT8 rules (docs/numerics.md): scale' =
max(fp32(amax), fp32(eps)) / 127 in fp32, q' = v / scale' rounded half to even, clamped to ±127.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel

from .backends.torch.quant import block_scale, encode, weight_blocks
from .formats import DEFAULT_BLOCK, DEFAULT_EPS
from .definitions import checks

_OP = "fp8_to_int8_blocks"
_CHUNK_ELEMENTS = 1 << 24  # weight elements per step: bounds the float64 temporaries (128 MiB each)


class RequantError(BaseModel):
    """The INT8 weight W' = q'·scale' against the FP8 weight W = q·scale it was converted from."""

    rel_fro: float  # ‖W' − W‖_F / ‖W‖_F (0 for an all-zero W)
    max_abs: float  # max |W' − W|
    worst_block: tuple[int, int]  # (block row, block column) with the largest ‖W'_b − W_b‖_F / ‖W_b‖_F
    worst_block_rel: float  # that block's relative error
    flushed: int  # non-zero FP8 values that became 0 in INT8 (less than half their block's INT8 step)
    nonzero: int  # non-zero FP8 values
    blocks: int

    def __str__(self) -> str:
        share = self.flushed / self.nonzero if self.nonzero else 0.0
        return (f"FP8 -> INT8: relative error {self.rel_fro:.3e} (Frobenius), max |error| {self.max_abs:.3e}, "
                f"worst block {self.worst_block} at {self.worst_block_rel:.3e}, {self.flushed} of {self.nonzero} "
                f"non-zero values flushed to 0 ({share:.2%}), {self.blocks} blocks")


def fp8_to_int8_blocks(w: torch.Tensor, scale: torch.Tensor, *, block_size: Any = DEFAULT_BLOCK,
                       eps: float = DEFAULT_EPS) -> tuple[torch.Tensor, torch.Tensor, RequantError]:
    """Re-quantize an FP8 block-quantized weight as INT8 blocks of the same shape.

    w [N, K] torch.float8_e4m3fn, scale [ceil(N/Bn), ceil(K/Bk)] fp32 (its dequantization multipliers,
    `weight_scale_inv` in DeepSeek-V3 checkpoints), block_size (Bn, Bk); on any device. Returns
    (q [N, K] int8, scale' [ceil(N/Bn), ceil(K/Bk)] fp32, the conversion's error), q and scale' as
    `ops.weight_quant(..., dtype=torch.int8)` lays them out. An all-zero block gets scale' eps/127.
    """
    w = checks.matrix(_OP, "w", w, (torch.float8_e4m3fn,))
    scale = checks.matrix(_OP, "scale", scale, (torch.float32,))
    checks.same_device(_OP, w=w, scale=scale)
    bn, bk = checks.block_pair(_OP, block_size)
    eps = checks.eps(_OP, eps, 127.0)
    N, K = w.shape
    bn, bk = checks.within(bn, N), checks.within(bk, K)
    grid = (math.ceil(N / bn), math.ceil(K / bk))
    checks.shape(_OP, "scale", scale, grid, f"one scale per {bn}x{bk} block of w {tuple(w.shape)}")
    nan = (w.view(torch.uint8) & 0x7F) == 0x7F
    if bool(nan.any()):
        row, col = (int(i) for i in nan.nonzero()[0])
        raise checks.fail(_OP, f"w holds {int(nan.sum())} NaN codes (the first at [{row}, {col}]); a weight must "
                               "be finite to convert: check the checkpoint")
    if not bool(torch.isfinite(scale).all()):
        raise checks.fail(_OP, "scale holds NaN or Inf; a weight's dequantization multipliers must be finite")

    q = torch.empty((N, K), dtype=torch.int8, device=w.device)
    new_scale = torch.empty(grid, dtype=torch.float32, device=w.device)
    err2, ref2 = (torch.zeros(grid, dtype=torch.float64, device=w.device) for _ in range(2))
    max_abs, flushed, nonzero = 0.0, 0, 0
    step = max(1, _CHUNK_ELEMENTS // (bn * K))  # block rows per step
    for r in range(0, grid[0], step):
        rows = slice(r * bn, min(N, (r + step) * bn))
        v = weight_blocks(w[rows].double(), bn, bk) * scale[r:r + step, None, :, None].double()
        s = block_scale(v.abs().amax(dim=(1, 3)), torch.int8, False, eps)
        qb = encode(v / s[:, None, :, None].double(), torch.int8)
        diff = qb.double() * s[:, None, :, None].double() - v
        err2[r:r + step] = diff.square().sum(dim=(1, 3))
        ref2[r:r + step] = v.square().sum(dim=(1, 3))
        max_abs = max(max_abs, float(diff.abs().max()))
        flushed += int(((qb == 0) & (v != 0)).sum())
        nonzero += int((v != 0).sum())
        new_scale[r:r + step] = s
        q[rows] = qb.reshape(qb.shape[0] * bn, -1)[: rows.stop - rows.start, :K]
    rel = torch.where(ref2 > 0, err2 / ref2, 0.0).sqrt()
    worst = int(rel.argmax())
    total = float(ref2.sum())
    error = RequantError(rel_fro=math.sqrt(float(err2.sum()) / total) if total else 0.0, max_abs=max_abs,
                         worst_block=divmod(worst, grid[1]), worst_block_rel=float(rel.flatten()[worst]),
                         flushed=flushed, nonzero=nonzero, blocks=grid[0] * grid[1])
    return q, new_scale, error
