"""Round-29 probe (H100), on a tree with lead.diff applied (not shipped): consumer warpgroup 1 starting LEAD
sub-tile wgmmas behind consumer 0 (`GluonConfig.lead`), so that the two warpgroups' K-block boundaries, where
each has no wgmma in flight (it waits for its last one before promoting it), fall apart rather than together. config_for's tile with lead 0 (as shipped) and LEADS
(default 1,2,3), timed interleaved with cuBLAS block-wise FP8 / `torch._int_mm` (`timing.gpu_times_us`), outputs
compared bit for bit with lead 0's; one JSON line per case and implementation.

Usage: python3 lead_probe.py TAG >> out.jsonl;  python3 lead_probe.py --warm I N  (compiles every I-th of N cases)
"""
import json
import os
import sys
from dataclasses import replace

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing

PROFILE = capability.profile_for("cuda")
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
LEADS = [int(v) for v in os.environ.get("LEADS", "1,2,3").split(",")]
SHAPES = ((24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))
CASES = [(f, m, n, k) for f in ("fp8", "int8") for m in (4096, 16384) for n, k in SHAPES]
CASES += [("fp8", 512, 7168, 16384), ("fp8", 512, 4096, 7168)]
warm = sys.argv[1] == "--warm"
part = CASES[int(sys.argv[2])::int(sys.argv[3])] if warm else CASES

for fmt, m, n, k in part:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
    b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
    base_cfg = gl.config_for(m, n, k, 128, None)
    groups = (base_cfg.block_n // base_cfg.sub) if base_cfg.sub < base_cfg.block_n else 2
    fns = {}
    for lead in [0] + [x for x in LEADS if x < groups]:
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                   out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                   eps=1e-4, profile=PROFILE, config=replace(base_cfg, lead=lead))
        fns[f"lead{lead}"] = lambda run=run: run(a, a_s, b, b_s)
    if warm:
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        continue
    ref = fns["lead0"]().view(torch.int16).clone()
    same = {name: torch.equal(fn().view(torch.int16), ref) for name, fn in fns.items()}
    fns["vendor"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s) if fmt == "fp8" else baselines.int_mm(a, b)
    us = timing.gpu_times_us(list(fns.values()))
    base_us = us[-1]
    for (name, _), t in zip(fns.items(), us):
        if name != "vendor":
            print(json.dumps(dict(tag=name, fmt=fmt, m=m, n=n, k=k, us=t, base_us=base_us, bits=int(same[name]),
                                  run=sys.argv[1])), flush=True)
    del a, b, ref
    torch.cuda.empty_cache()
