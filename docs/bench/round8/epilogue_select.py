"""Round-8 probe (H100): data for how GEMMs with a bias (or an activation) should be selected, which the
measured tables do not rank today (a GEMM with any epilogue takes the default order: the tiled Triton
kernel on sm_90). GPU time of scaled_mm with a bf16 bias, and with bias + GELU, for the tiled kernel,
the Gluon kernel and cuBLAS block-wise behind quantcore (`torch[cublas]`, its epilogue as torch ops on
an fp32 result), beside torch's bf16 linear with the same bias, on the six bench shapes and the decode
model's (4096x4096, 16384x4096, 4096x16384), FP8 and INT8, M = 128 and 4096.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round8/epilogue_select.py
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import math
import traceback

import torch
import torch.nn.functional as F

from quantcore import ops
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512), (4096, 4096),
          (16384, 4096), (4096, 16384)]
BACKENDS = {torch.float8_e4m3fn: ("triton", "triton[gluon]", "torch[cublas]"), torch.int8: ("triton", "triton[gluon]")}


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for fmt, backends in BACKENDS.items():
    for M in (128, 4096):
        for act in (None, "gelu"):
            best = {b: [] for b in backends}
            for N, K in SHAPES:
                try:
                    torch.manual_seed(0)
                    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                    wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
                    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
                    a, a_s = ops.act_quant(x, dtype=fmt)
                    w, w_s = ops.weight_quant(wb, dtype=fmt)
                    bf16 = gpu_time_us(lambda: F.gelu(F.linear(x, wb, bias)) if act else F.linear(x, wb, bias))
                    cells, times = [], {}
                    for b in backends:
                        try:
                            times[b] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, bias=bias, activation=act,
                                                                         backend=b))
                        except Exception as exc:  # a backend that cannot take the shape
                            times[b] = float("nan")
                            cells.append(f"{b} n/a ({type(exc).__name__})")
                    fastest = min(t for t in times.values() if t == t)
                    for b, t in times.items():
                        if t == t:
                            best[b].append(fastest / t)
                            cells.append(f"{b} {t:7.1f}")
                    print(f"{str(fmt)[6:]:13s} M={M:5d} {N:6d}x{K:<6d} bias{'+' + act if act else ''}: "
                          + " | ".join(cells) + f" | bf16 linear{'+gelu' if act else ''} {bf16:7.1f}", flush=True)
                except Exception:
                    traceback.print_exc()
            print(f"  {str(fmt)[6:]} M={M} bias{'+' + act if act else ''}: fastest / each, geomean (worst): "
                  + ", ".join(f"{b} {geomean(r):.2f} ({min(r):.2f})" for b, r in best.items() if r), flush=True)
print("done", flush=True)
