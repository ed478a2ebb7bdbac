"""Round-8 probe (H100): what each fused epilogue of the Gluon GEMM (`triton[gluon]`) costs over the plain
GEMM (bf16 out), on the six bench shapes at M = 512, 4096 and 16384, FP8 and INT8: bias + SiLU, bias +
GELU (erf), fp32 out, and the output re-quantized per 1x128 (codes in the operand format, fp32 scales).
Issue 14 asks for at most 5 % over the plain GEMM.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round8/gluon_epilogues.py
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import math
import traceback

import torch

from quantcore import ops
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
dev = "cuda"


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for fmt in (torch.float8_e4m3fn, torch.int8):
    for M in (512, 4096, 16384):
        over = {}
        for N, K in SHAPES:
            try:
                torch.manual_seed(0)
                a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
                w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=fmt)
                bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
                variants = {"plain": {}, "bias+silu": dict(bias=bias, activation="silu"),
                            "bias+gelu": dict(bias=bias, activation="gelu"), "fp32 out": dict(out_dtype=torch.float32),
                            "requant": dict(out_quant=fmt, out_group_size=128)}
                times = {name: gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton[gluon]", **kw))
                         for name, kw in variants.items()}
                base = times["plain"]
                cells = [f"plain {base:8.1f} us"] + [f"{name} x{t / base:.3f}" for name, t in times.items()
                                                     if name != "plain"]
                for name, t in times.items():
                    over.setdefault(name, []).append(t / base)
                print(f"{str(fmt)[6:]:13s} M={M:5d} {N:6d}x{K:<6d} " + " | ".join(cells), flush=True)
            except Exception:
                traceback.print_exc()
        print(f"  {str(fmt)[6:]} M={M} time / plain, geomean (worst): " + ", ".join(
            f"{name} {geomean(rs):.3f} ({max(rs):.3f})" for name, rs in over.items() if name != "plain"), flush=True)
print("done", flush=True)
