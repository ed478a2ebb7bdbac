"""Round-7 probe (H100): CuPy's quant_linear in one launch (the activation quantized in the GEMM's
prologue) against the two launches it replaced (CuPy act_quant + scaled_mm, bit for bit the same), and
Triton's quant_linear beside them, at M = 1, 4 and 8 on the six DeepSeek-V3 decode shapes: GPU time
(`gpu_time_us`, L2 flushed) and eager time per call (`eager_time_us`, back to back), bf16 activation.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round7/cupy_fused.py
"""
import math

import torch

from quantcore import ops
from quantcore.bench.timing import eager_time_us, gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
for qdtype in (torch.float8_e4m3fn, torch.int8):
    for m in (1, 4, 8):
        gains = []
        for n, k in SHAPES:
            torch.manual_seed(0)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w, w_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=qdtype)
            fused = lambda: ops.quant_linear(x, w, w_s, backend="cupy")
            two = lambda: ops.scaled_mm(*ops.act_quant(x, dtype=qdtype, backend="cupy"), w, w_s, backend="cupy")
            tri = lambda: ops.quant_linear(x, w, w_s, backend="triton")
            one = torch.equal(fused(), two())
            g = [gpu_time_us(f) for f in (fused, two, tri)]
            e = [eager_time_us(f, n=400) for f in (fused, two, tri)]
            gains.append(g[1] / g[0])
            print(f"{str(qdtype)[6:]} M={m} {n}x{k}: GPU us fused {g[0]:.1f} | two launches {g[1]:.1f} | triton {g[2]:.1f}"
                  f" || eager us fused {e[0]:.1f} | two {e[1]:.1f} | triton {e[2]:.1f} || bit-equal {one}", flush=True)
        print(f"  geomean GPU time two launches / fused: {geo(gains):.2f}", flush=True)
