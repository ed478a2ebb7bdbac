"""Round-8 probe (H100): the Gluon GEMM with consumer 1 trailing consumer 0 by `lag` K blocks, so that
one warpgroup's epilogue (and promotion) runs while the other's wgmmas do, beside cuBLAS block-wise
(FP8) and torch._int_mm (INT8), on the six bench shapes at M = 512, 4096 and 16384.

Variants per shape: `config_for`'s choice (lag 0, what ships), the same with lag 1, 2 and 3 (cut to
what the ring allows), and from 4096 rows the 128x128 default with lag 2 and 3. Every variant's output
is compared with the lag-0 output of the same configuration (bit for bit expected).

Ran at commit b0286a5, which had the lag (it was removed after this run): `git checkout b0286a5`, then
from the repository root: PYTHONPATH=$PWD python3 docs/bench/round8/gluon_lag.py [out.json]
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import dataclasses
import json
import math
import sys
import traceback

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
dev = "cuda"
profile = capability.profile_for(torch.device(dev))
rows = []


def operands(M, N, K, fmt, seed=0):
    torch.manual_seed(seed)
    a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
    w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=fmt)
    return a, a_s, w, w_s


def runner(cfg, a, a_s, w, w_s):
    run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                                profile=profile, config=cfg)
    return lambda: run(a, a_s, w, w_s)


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def name(cfg):
    return f"{cfg.block_m}x{cfg.block_n}" + (f"/{cfg.sub_n}" if cfg.sub_n else "") + f" lag{cfg.lag}"


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for fmt, vendor in ((torch.float8_e4m3fn, "cublas"), (torch.int8, "int_mm")):
    for M in (512, 4096, 16384):
        ratios = {}
        for N, K in SHAPES:
            try:
                a, a_s, w, w_s = operands(M, N, K, fmt)
                now = gll.config_for(M, N, 128, None)
                variants = [dataclasses.replace(now, lag=lag) for lag in (0, 1, 2, 3)]
                if now != gll.DEFAULT:
                    variants += [dataclasses.replace(gll.DEFAULT, lag=lag) for lag in (2, 3)]
                fl = 2 * M * N * K / 1e6
                if vendor == "cublas":
                    ven = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="torch[cublas]"))
                else:
                    ven = gpu_time_us(baselines.int_mm(a, w))
                line = [f"{str(fmt)[6:]:13s} M={M:5d} {N:6d}x{K:<6d} {vendor} {fl / ven:6.0f}"]
                refs = {}
                for cfg in variants:
                    call = runner(cfg, a, a_s, w, w_s)
                    out = call()
                    key = dataclasses.replace(cfg, lag=0)
                    refs.setdefault(key, out)
                    same = torch.equal(out, refs[key])
                    t = gpu_time_us(call)
                    label = ("config_for" if dataclasses.replace(cfg, lag=0) == now else "128x128") + f" lag{cfg.lag}"
                    ratios.setdefault(label, []).append(ven / t)
                    line.append(f"{name(cfg)} {fl / t:6.0f} x{ven / t:.2f}{'' if same else ' DIFFERS'}")
                    rows.append(dict(fmt=str(fmt), M=M, N=N, K=K, config=dataclasses.asdict(cfg), us=t, vendor_us=ven,
                                     same=same))
                print(" | ".join(line), flush=True)
            except Exception:
                traceback.print_exc()
        for label, rs in ratios.items():
            if len(rs) == len(SHAPES):
                print(f"  {str(fmt)[6:]} M={M} {label}: geomean x{geomean(rs):.3f} worst x{min(rs):.2f}", flush=True)
        best = [max(r["vendor_us"] / r["us"] for r in rows
                    if r["fmt"] == str(fmt) and r["M"] == M and (r["N"], r["K"]) == shape) for shape in SHAPES]
        print(f"  {str(fmt)[6:]} M={M} best variant per shape: geomean x{geomean(best):.3f} worst x{min(best):.2f}",
              flush=True)
if len(sys.argv) > 1:
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
print("done", flush=True)
