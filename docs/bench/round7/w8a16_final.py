"""Round-7 check (H100, as simulate("sm80")): `ops.scaled_mm` on FP8 data as the registry runs it after
this round (predecode from 512 rows within 512 MiB, 64-wide K steps), against the bf16 GEMM, at M = 16,
128, 256, 512 and 4096 on the six DeepSeek-V3 shapes (GPU time, `gpu_time_us`), with the selected variant.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round7/w8a16_final.py
"""
import math

import torch

import quantcore
from quantcore import ops
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
for M in (16, 128, 256, 512, 4096):
    ratios = []
    for N, K in SHAPES:
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
        bf = gpu_time_us(baselines.bf16_mm(M, N, K))
        with quantcore.simulate("sm80"):
            sel = quantcore.explain("scaled_mm", a, a_s, w, w_s).selected
            t = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
        ratios.append(bf / t)
        print(f"M={M} {N}x{K}: bf16 {bf:.1f} us | {sel} {t:.1f} us ({bf / t:.2f}x bf16)", flush=True)
    print(f"M={M} geomean bf16 time / time: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
