"""Issue 14: each K block's A rows loaded into registers once for all of a wide tile's column sub-tiles
(`GluonConfig.a_regs`), so that the sub-tiles' wgmmas read only B from shared memory (from the slot, the
four 64-column wgmmas of a 128x256 tile read the consumer's A rows four times). FP8, bf16 out, plain, 4096
and 16384 rows, timed interleaved with cuBLAS block-wise (`timing.gpu_times_us`); every output compared bit
for bit with `config_for`'s; an INT8 pass checks bits only. Offline (ptxas -v), the 128x256 tile with A in
registers spills 864 bytes, 128x192 184, 128x128 in 64-column sub-tiles none.

Usage: python3 aregs_probe.py   (one line per shape, then the geometric means of cuBLAS time / config time)
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
    "128x256/64 a_regs": gl.GluonConfig(block_n=256, sub_n=64, producer_regs=24, a_regs=True),
    "128x192/64 a_regs": gl.GluonConfig(block_n=192, sub_n=64, a_regs=True),
    "128x128/64": gl.GluonConfig(sub_n=64),
    "128x128/64 a_regs": gl.GluonConfig(sub_n=64, a_regs=True),
}
SHAPES = [(4096, n, k) for n, k in ((32768, 512), (24576, 1536), (7168, 2048), (2112, 7168), (4096, 7168),
                                    (7168, 16384))] + [(16384, 32768, 512), (16384, 24576, 1536)]
ratios = {name: [] for name in ("config_for", *CONFIGS)}
for m, n, k in SHAPES:
    if time.time() - T0 > 330:
        print("time budget reached")
        break
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        a, a_s = ops.act_quant(x, dtype=qdtype)
        b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), dtype=qdtype)
        base = gl.config_for(m, n, 128, None)
        fns, shown = {}, {}
        for name, cfg in {"config_for": base, **CONFIGS}.items():
            if n % cfg.block_n:
                continue
            run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=PROFILE, config=cfg)
            fns[name] = lambda run=run: run(a, a_s, b, b_s)
        ref = fns["config_for"]().view(torch.int16)
        for name, fn in fns.items():
            shown[name] = "" if all(torch.equal(fn().view(torch.int16), ref) for _ in range(3)) else " (OTHER BITS)"
        if qdtype == torch.int8:
            print(f"  int8 {m}x{n}x{k} bits:", ", ".join(f"{name}{shown[name] or ' same'}" for name in fns), flush=True)
            continue
        fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
        us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
        line = ", ".join(f"{name} {us[name]:.1f}{shown.get(name, '')}" for name in fns)
        print(f"{m}x{n}x{k} (config_for {base.block_m}x{base.block_n}/{base.sub}): {line}", flush=True)
        for name in ratios:
            if name in us:
                ratios[name].append(us["cublas"] / us[name])
        del a, b, x
        torch.cuda.empty_cache()
print("\ncuBLAS time / config time, geometric mean (shapes timed), lowest:")
for name, r in ratios.items():
    if r:
        print(f"  {name:18s} {statistics.geometric_mean(r):.3f} over {len(r)}, lowest {min(r):.3f}")
print(f"total {time.time() - T0:.0f} s")
