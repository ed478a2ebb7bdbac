"""Round-29 probe (H100): at long K, is a wide tile whose wgmmas are 128 columns wide (128×256 in two 128-column
sub-tiles, each warpgroup promoting one while the other's wgmma runs, no pipelined pair of its own: half the
shared-memory reads of A of config_for's four 64-column sub-tiles) cheaper in energy, so faster under the 700 W
cap? Per case, config_for's tile, that one, the default 128×128 and cuBLAS block-wise FP8 are timed interleaved
(`timing.gpu_times_us`, the bench's method), then each runs back to back for PHASE seconds, alternating, twice,
while `nvidia-smi` samples the SM clock and power every 50 ms. Outputs compared bit for bit with config_for's.

Usage: python3 tiles_sustained.py OUT_DIR
"""
import os
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing

sys.path.insert(0, os.path.dirname(__file__))
from sustained import Phases  # noqa: E402

PROFILE = capability.profile_for("cuda")
out_dir = sys.argv[1]
CASES = [(16384, 7168, 16384), (16384, 4096, 7168), (4096, 7168, 16384)]
WIDE128 = gl.GluonConfig(block_n=256, sub_n=128, producer_regs=64, pipeline=False)

notes = []
with Phases(f"{out_dir}/smi_tiles.csv") as phases:
    for m, n, k in CASES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g))
        b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g))
        fns = {}
        for name, cfg in (("config_for", gl.config_for(m, n, k, 128, None)), ("256/128", WIDE128),
                          ("128x128", gl.DEFAULT)):
            run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=PROFILE, config=cfg)
            fns[name] = lambda run=run: run(a, a_s, b, b_s)
        fns["cublas"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
        ref = fns["config_for"]().view(torch.int16)
        same = {name: torch.equal(fns[name]().view(torch.int16), ref) for name in ("256/128", "128x128")}
        us = timing.gpu_times_us(list(fns.values()))
        notes.append(f"{m}x{n}x{k} interleaved µs: " + ", ".join(f"{nm} {u:.1f}" for nm, u in zip(fns, us))
                     + f"; same bits as config_for: {same}")
        torch.cuda.synchronize()
        for _ in range(2):
            for name, fn in fns.items():
                phases.run(f"{m}x{n}x{k}", name, fn)
        del a, b, fns, ref
        torch.cuda.empty_cache()
print("\n".join(notes))
print(phases.table("impl"))
