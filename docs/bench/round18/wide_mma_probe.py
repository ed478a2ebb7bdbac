"""Issue 14: a 128x256 tile in 128-column sub-tiles (m64n128k32 wgmmas, half as many per K block as in
64-column ones) without the pipelined pair (one partial in registers), with more registers for the
producer warp: offline (ptxas -v) the producer's 24 registers were what spilled (784 bytes; 36 with 64).
Its two 128-column epilogue buffers per consumer leave room for 3 stages. FP8, bf16 out, plain, 4096 and
16384 rows, timed interleaved with cuBLAS block-wise (`timing.gpu_times_us`); every output compared bit for
bit with `config_for`'s; an INT8 pass checks bits only.

Usage: python3 wide_mma_probe.py   (one line per shape, then the geometric means of cuBLAS time / config time)
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
    "128x256/128 p64": gl.GluonConfig(block_n=256, sub_n=128, pipeline=False, producer_regs=64),
    "128x256/128 p56": gl.GluonConfig(block_n=256, sub_n=128, pipeline=False, producer_regs=56),
    "128x128": gl.DEFAULT,
}
SHAPES = [(4096, n, k) for n, k in ((32768, 512), (24576, 1536), (7168, 2048), (4096, 7168), (7168, 16384))] + [
    (16384, 32768, 512), (16384, 24576, 1536)]
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
            run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=PROFILE, config=cfg)
            fns[name] = lambda run=run: run(a, a_s, b, b_s)
        ref = fns["config_for"]().view(torch.int16)
        for name, fn in fns.items():
            shown[name] = "" if torch.equal(fn().view(torch.int16), ref) else " (OTHER BITS)"
        if qdtype == torch.int8:
            print(f"  int8 {m}x{n}x{k} bits:", ", ".join(f"{name}{shown[name] or ' same'}" for name in fns), flush=True)
            continue
        fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
        us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
        line = ", ".join(f"{name} {us[name]:.1f}{shown.get(name, '')}" for name in fns)
        print(f"{m}x{n}x{k}: {line}", flush=True)
        for name in ratios:
            ratios[name].append(us["cublas"] / us[name])
        del a, b, x
        torch.cuda.empty_cache()
print("\ncuBLAS time / config time, geometric mean (shapes timed), lowest:")
for name, r in ratios.items():
    if r:
        print(f"  {name:18s} {statistics.geometric_mean(r):.3f} over {len(r)}, lowest {min(r):.3f}")
print(f"total {time.time() - T0:.0f} s")
