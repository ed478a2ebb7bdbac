"""Round-9 probe (H100): which kernel to select for GEMMs with an activation or a re-quantized output,
now that the Gluon kernel stages its activation epilogue (round9/gluon_staged.py measured it at 512 and
4096 rows). GPU time of scaled_mm through the tiled Triton kernel (`triton`) and the Gluon kernel
(`triton[gluon]`), with bias + SiLU, bias + GELU, a re-quantized output (groups of 128, the operands'
format) and bias + GELU re-quantized, on the six bench shapes and the decode model's three, FP8 and
INT8, at M = 128 and 16384.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round9/epilogue_select.py
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import math
import traceback

import torch

from quantcore import ops
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512), (4096, 4096),
          (16384, 4096), (4096, 16384)]
EPILOGUES = {"bias+silu": dict(bias=True, activation="silu"), "bias+gelu": dict(bias=True, activation="gelu"),
             "requant": dict(requant=True), "bias+gelu+requant": dict(bias=True, activation="gelu", requant=True)}
BACKENDS = ("triton", "triton[gluon]")


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for fmt in (torch.float8_e4m3fn, torch.int8):
    for M in (128, 16384):
        ratios = {e: [] for e in EPILOGUES}
        for N, K in SHAPES:
            try:
                torch.manual_seed(0)
                a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=fmt)
                w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=fmt)
                bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
                cells = []
                for e, epi in EPILOGUES.items():
                    kw = dict(bias=bias if epi.get("bias") else None, activation=epi.get("activation"),
                              out_quant=fmt if epi.get("requant") else None)
                    t = {b: gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend=b, **kw)) for b in BACKENDS}
                    ratios[e].append(t["triton"] / t["triton[gluon]"])
                    cells.append(f"{e} {t['triton']:7.1f}/{t['triton[gluon]']:7.1f}")
                print(f"{str(fmt)[6:]:13s} M={M:5d} {N:6d}x{K:<6d} tiled/gluon us: " + " | ".join(cells), flush=True)
            except Exception:
                traceback.print_exc()
        print(f"  {str(fmt)[6:]} M={M}: tiled time / Gluon time, geomean (min-max): " + "; ".join(
            f"{e} {geomean(r):.3f} ({min(r):.2f}-{max(r):.2f})" for e, r in ratios.items() if r), flush=True)
