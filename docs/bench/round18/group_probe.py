"""Issue 14, after the bf16 epilogue change: does another grouped walk (`GluonConfig.group_m`, row tiles per L2
group; config_for's is 8) help the Gluon GEMM at 4096 and 16384 rows? FP8, bf16 out, plain, config_for's
tile with group_m 4, 8, 16, 32, timed interleaved with cuBLAS block-wise (`timing.gpu_times_us`), outputs
compared bit for bit with group 8's.

Usage: python3 group_probe.py   (one line per shape, then the geometric means of cuBLAS time / config time)
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing

T0 = time.time()
PROFILE = capability.profile_for("cuda")
GROUPS = (8, 4, 16, 32)
SHAPES = [(m, n, k) for m in (4096, 16384) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                                        (4096, 7168), (7168, 2048))]
ratios = {g: [] for g in GROUPS}
for m, n, k in SHAPES:
    if time.time() - T0 > 300:
        print("time budget reached")
        break
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, a_s = ops.act_quant(x)
    b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    base = gl.config_for(m, n, 128, None)
    fns = {}
    for g in GROUPS:
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                   out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                   profile=PROFILE, config=dataclasses.replace(base, group_m=g))
        fns[g] = lambda run=run: run(a, a_s, b, b_s)
    ref = fns[8]().view(torch.int16)
    shown = {g: "" if torch.equal(fn().view(torch.int16), ref) else " (OTHER BITS)" for g, fn in fns.items()}
    fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
    us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
    print(f"{m}x{n}x{k} ({base.block_m}x{base.block_n}): " + ", ".join(
        f"group {g} {us[g]:.1f}{shown[g]}" for g in GROUPS) + f", cublas {us['cublas']:.1f}", flush=True)
    for g in GROUPS:
        ratios[g].append(us["cublas"] / us[g])
    del a, b, x
    torch.cuda.empty_cache()
print("\ncuBLAS time / config time, geometric mean (shapes timed), lowest:")
for g, r in ratios.items():
    print(f"  group {g:2d}: {statistics.geometric_mean(r):.3f} over {len(r)}, lowest {min(r):.3f}"
          f"  (4096 rows {statistics.geometric_mean(r[:6]):.3f}, 16384 rows {statistics.geometric_mean(r[6:]) if len(r) > 6 else float('nan'):.3f})")
print(f"total {time.time() - T0:.0f} s")
