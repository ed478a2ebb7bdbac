"""The Gluon GEMM's TMA-store buffers per consumer warpgroup (`GluonConfig.epi_buffers`) on the wide tile
(128×256 in 64-column sub-tiles), FP8, bf16 out, plain, timed interleaved beside cuBLAS block-wise (round 16's
protocol: `timing.gpu_times_us`). With two buffers a sub-tile's store waits for the one two before it; with
four, within a tile none waits. Four buffers take 32 KB more shared memory: one stage fewer fits, so a
3-stage run with two buffers is the control. Every output is compared bit for bit with the shipped choice's.

Usage: python3 epi_probe.py   (one line per shape, then the geometric means of cuBLAS time / config time).
It runs against commit 215de1e, which had `GluonConfig.epi_buffers`; the next commit removed it again.
"""

from __future__ import annotations

import statistics
import time

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing

T0 = time.time()
PROFILE = capability.profile_for("cuda")
WIDE = dict(block_n=256, sub_n=64, producer_regs=24)
CONFIGS = {
    "epi2 (shipped)": gl.WIDE[0],
    "epi1": gl.GluonConfig(**WIDE, epi_buffers=1),
    "epi2 3 stages": gl.GluonConfig(**WIDE, stages=3),
    "epi4": gl.GluonConfig(**WIDE, epi_buffers=4),
}
for name, cfg in CONFIGS.items():
    print(name, "stages", gl._fitted(cfg, 128, 2, 128, PROFILE, False)[0], flush=True)
SHAPES = [(4096, n, k) for n, k in ((32768, 512), (24576, 1536), (7168, 2048), (4096, 7168), (7168, 16384))] + \
    [(16384, 32768, 512), (16384, 24576, 1536)]
ratios = {name: [] for name in CONFIGS}
for m, n, k in SHAPES:
    if time.time() - T0 > 300:
        print("time budget reached")
        break
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, a_s = ops.act_quant(x, dtype=torch.float8_e4m3fn)
    b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), dtype=torch.float8_e4m3fn)
    fns, shown = {}, {}
    for name, cfg in CONFIGS.items():
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                   out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                   profile=PROFILE, config=cfg)
        fns[name] = lambda run=run: run(a, a_s, b, b_s)
    ref = fns["epi2 (shipped)"]().view(torch.int16)
    for name, fn in fns.items():
        shown[name] = "" if torch.equal(fn().view(torch.int16), ref) else " (OTHER BITS)"
    fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
    us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
    print(f"{m}x{n}x{k}: " + " ".join(f"{name} {us[name]:.1f}{shown.get(name, '')}" for name in fns), flush=True)
    for name in CONFIGS:
        ratios[name].append(us["cublas"] / us[name])
    del a, b, x
    torch.cuda.empty_cache()
print("\ncuBLAS time / config time, geometric mean over the shapes timed (lowest):")
for name, r in ratios.items():
    if r:
        print(f"  {name:16s} {statistics.geometric_mean(r):.3f} ({min(r):.3f})")
