"""The Gluon GEMM's tile configurations at 4096 and 16384 rows, timed interleaved beside cuBLAS block-wise
(round 16's protocol: `timing.gpu_times_us`), FP8, bf16 out, plain: is `config_for`'s choice the fastest
once the timing is fair? Every configuration's output is compared bit for bit with the default's.

Usage: python3 gluon_sweep.py   (prints one line per shape and the geometric means)
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
CONFIGS = {
    "default 128x128": gl.DEFAULT,
    "128x256 sub64": gl.WIDE[0],
    "128x192 sub64": gl.WIDE[1],
    "128x128 group4": gl.GluonConfig(group_m=4),
    "128x128 group16": gl.GluonConfig(group_m=16),
    "128x256 sub128": gl.GluonConfig(block_n=256, sub_n=128, producer_regs=24),
}
SHAPES = [(4096, n, k) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                                    (7168, 2048))] + [(16384, 32768, 512), (16384, 24576, 1536), (16384, 2112, 7168)]
ratios = {name: [] for name in CONFIGS}
for m, n, k in SHAPES:
    if time.time() - T0 > 330:
        print("time budget reached")
        break
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, a_s = ops.act_quant(x, dtype=torch.float8_e4m3fn)
    b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), dtype=torch.float8_e4m3fn)
    fns, shown = {}, {}
    for name, cfg in CONFIGS.items():
        if cfg.block_n > 128 and n % cfg.block_n:  # a wide tile only where N fills it, as config_for
            continue
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                           out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                           profile=PROFILE, config=cfg)
        fns[name] = lambda run=run: run(a, a_s, b, b_s)
    ref = fns["default 128x128"]().view(torch.int16)
    for name, fn in fns.items():
        same = torch.equal(fn().view(torch.int16), ref)
        shown[name] = "" if same else " (OTHER BITS)"
    fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
    us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
    line = " ".join(f"{name} {us[name]:.1f}{shown.get(name, '')}" for name in fns)
    print(f"{m}x{n}x{k}: {line}", flush=True)
    for name in CONFIGS:
        if name in us:
            ratios[name].append(us["cublas"] / us[name])
    del a, b, x
    torch.cuda.empty_cache()
print("\ncuBLAS time / config time, geometric mean (shapes timed), lowest:")
for name, r in ratios.items():
    if r:
        print(f"  {name:18s} {statistics.geometric_mean(r):.3f} over {len(r)}, lowest {min(r):.3f}")
print(f"total {time.time() - T0:.0f} s")
