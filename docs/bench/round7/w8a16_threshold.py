"""Round-7 probe (H100, as simulate("sm80")): where the W8A16 GEMM's predecode starts paying, M = 160-512
on the six DeepSeek-V3 shapes: `ops.scaled_mm` with the operands decoded once per call (configs.predecode
forced on) and decoded in the kernel (forced off), beside the bf16 GEMM (GPU time, `gpu_time_us`).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round7/w8a16_threshold.py
"""
import math

import torch

import quantcore
from quantcore import dispatch, ops
from quantcore.backends.triton import configs
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
for M in (160, 256, 384, 512):
    r = {True: [], False: []}
    for N, K in SHAPES:
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
        bf = gpu_time_us(baselines.bf16_mm(M, N, K))
        t = {}
        for on in (True, False):
            configs.predecode = lambda profile, m, n, k, on=on: on
            dispatch._plans.clear()
            with quantcore.simulate("sm80"):
                t[on] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
            r[on].append(bf / t[on])
        print(f"M={M} {N}x{K}: bf16 {bf:.1f} | predecoded {t[True]:.1f} ({bf / t[True]:.2f}x) | "
              f"in-kernel decode {t[False]:.1f} ({bf / t[False]:.2f}x)", flush=True)
    g = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in r.items()}
    print(f"M={M} geomean bf16/time: predecoded {g[True]:.2f}, in-kernel {g[False]:.2f}", flush=True)
