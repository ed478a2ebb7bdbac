"""Round-4 closing probe (H100): torch[bf16_dequant] after its operands moved to quantcore's dequant kernels,
beside the bf16 GEMM, with torch's default (fp32 result cast once) and with reduced-precision reductions
forbidden (a plain bf16 output straight from cuBLAS); the Gluon GEMM's wide tiles as `config_for` now picks
them, beside cuBLAS block-wise and torch._int_mm; the M = 64 decode rules beside the bf16 GEMM.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round4/r4_final.py
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import math
import traceback

import torch

from quantcore import ops
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
dev = "cuda"
flag = torch.backends.cuda.matmul


def operands(M, N, K, fmt, seed=0):
    torch.manual_seed(seed)
    a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
    w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=fmt)
    return a, a_s, w, w_s


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


print("== torch[bf16_dequant], FP8 data, bf16 out: us and bf16 GEMM / it", flush=True)
for M in (128, 4096):
    r_default, r_once = [], []
    for N, K in SHAPES:
        try:
            a, a_s, w, w_s = operands(M, N, K, torch.float8_e4m3fn)
            bf = gpu_time_us(baselines.bf16_mm(M, N, K))
            call = lambda: ops.scaled_mm(a, a_s, w, w_s, backend="torch[bf16_dequant]")
            flag.allow_bf16_reduced_precision_reduction = True
            t_default = gpu_time_us(call)
            flag.allow_bf16_reduced_precision_reduction = False
            t_once = gpu_time_us(call)
            flag.allow_bf16_reduced_precision_reduction = True
            exact = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
            r_default.append(bf / t_default)
            r_once.append(bf / t_once)
            print(f"M={M:5d} {N:6d}x{K:<6d} default {t_default:8.1f} ({bf / t_default:.2f}x) | reductions fp32 "
                  f"{t_once:8.1f} ({bf / t_once:.2f}x) | exact auto {exact:8.1f} | bf16 {bf:8.1f}", flush=True)
        except Exception:
            traceback.print_exc()
    print(f"M={M} geomean vs bf16: default {geomean(r_default):.2f}, reductions fp32 {geomean(r_once):.2f}",
          flush=True)

print("\n== triton[gluon] (config_for) vs vendor, TFLOP/s (TOP/s)", flush=True)
for fmt, vendor in ((torch.float8_e4m3fn, "cublas"), (torch.int8, "int_mm")):
    for M in (4096, 16384):
        ratios = []
        for N, K in SHAPES:
            try:
                a, a_s, w, w_s = operands(M, N, K, fmt)
                ours = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="triton[gluon]"))
                if vendor == "cublas":
                    ven = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend="torch[cublas]"))
                else:
                    ven = gpu_time_us(baselines.int_mm(a, w))
                fl = 2 * M * N * K / 1e6
                ratios.append(ven / ours)
                print(f"{str(fmt)[6:]:14s} M={M:5d} {N:6d}x{K:<6d} gluon {fl / ours:7.0f} | {vendor} {fl / ven:7.0f} | "
                      f"x{ven / ours:.2f}", flush=True)
            except Exception:
                traceback.print_exc()
        print(f"{str(fmt)[6:]} M={M} geomean gluon / {vendor}: x{geomean(ratios):.2f} (worst x{min(ratios):.2f})",
              flush=True)

print("\n== decode M = 64 (auto), us, beside bf16", flush=True)
for fmt in (torch.float8_e4m3fn, torch.int8):
    for N, K in SHAPES:
        a, a_s, w, w_s = operands(64, N, K, fmt)
        t = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
        bf = gpu_time_us(baselines.bf16_mm(64, N, K))
        print(f"{str(fmt)[6:]:14s} 64x{N}x{K} {t:6.1f} | bf16 {bf:6.1f} | x{bf / t:.2f}", flush=True)
print("done", flush=True)
