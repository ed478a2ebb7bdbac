"""Issue 14: does starting the Gluon GEMM's second consumer warpgroup a few K blocks after the first
(`GluonConfig.lag`), so that the two warpgroups' epilogues no longer coincide, close the gap to cuBLAS at
short K? FP8, bf16 out, plain, 4096 and 16384 rows; per shape `config_for`'s tile with lag 0, 1, 2 (and 3
at 4 K blocks or more), timed interleaved with cuBLAS block-wise (`timing.gpu_times_us`, round 16's
protocol); every lagged output compared bit for bit with lag 0's. An INT8 pass checks bits only.

Usage: python3 lag_probe.py   (one line per shape, then the geometric means of cuBLAS time / config time)
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
LAGS = (0, 1, 2, 3)
SHAPES = [(4096, n, k) for n, k in ((32768, 512), (24576, 1536), (7168, 2048), (2112, 7168), (4096, 7168),
                                    (7168, 16384))] + [(16384, 32768, 512), (16384, 24576, 1536)]
ratios = {lag: [] for lag in LAGS}
for m, n, k in SHAPES:
    if time.time() - T0 > 300:
        print("time budget reached")
        break
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        a, a_s = ops.act_quant(x, dtype=qdtype)
        b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), dtype=qdtype)
        base = gl.config_for(m, n, 128, None)
        fns, shown = {}, {}
        for lag in LAGS:
            if lag and lag >= k // 128:
                continue
            run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=PROFILE, config=dataclasses.replace(base, lag=lag))
            fns[lag] = lambda run=run: run(a, a_s, b, b_s)
        ref = fns[0]().view(torch.int16)
        for lag, fn in fns.items():
            shown[lag] = "" if torch.equal(fn().view(torch.int16), ref) else " (OTHER BITS)"
        if qdtype == torch.int8:
            print(f"  int8 {m}x{n}x{k} bits:", " ".join(f"lag {lag}{shown[lag] or ' same'}" for lag in fns), flush=True)
            continue
        fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
        us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
        line = " ".join(f"lag {name} {us[name]:.1f}{shown.get(name, '')}" if name != "cublas" else
                        f"cublas {us[name]:.1f}" for name in fns)
        print(f"{m}x{n}x{k} ({base.block_m}x{base.block_n}/{base.sub}): {line}", flush=True)
        for lag in LAGS:
            if lag in us:
                ratios[lag].append(us["cublas"] / us[lag])
        del a, b, x
        torch.cuda.empty_cache()
print("\ncuBLAS time / config time, geometric mean (shapes timed), lowest:")
for lag, r in ratios.items():
    if r:
        print(f"  lag {lag}: {statistics.geometric_mean(r):.3f} over {len(r)}, lowest {min(r):.3f}")
print(f"total {time.time() - T0:.0f} s")
