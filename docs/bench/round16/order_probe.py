"""Does a GEMM's measured time depend on when the bench times it? The large FP8 GEMMs (M = 4096 and
16384, the bench's six (N, K)), each implementation timed as the bench did before this round (one after
the other: GPU time, then its eager loop; the vendor kernels first) and interleaved (`bench.run._times`),
two passes of each in turn. `torch[cublas]` is cuBLAS's block-wise kernel behind quantcore's dispatch:
the vendor baseline's own kernel, so a fair protocol times the two alike.

Usage: python3 order_probe.py OUT.json   (prints a table; start `nvidia-smi -lms` beside it for clocks)
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time

import torch

from quantcore import ops
from quantcore.bench import baselines, timing

bench_run = importlib.import_module("quantcore.bench.run")

SHAPES = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
ORDER = ["cublas-fp8-tensorwise", "cublas-blockwise", "cublas-bf16", "triton", "cupy", "triton[gluon]", "torch[cublas]"]


def fns_for(m, n, k):
    a, a_s = ops.act_quant(bench_run._rand(m, k), dtype=torch.float8_e4m3fn)
    b, b_s = ops.weight_quant(bench_run._rand(n, k), dtype=torch.float8_e4m3fn)
    fns = {"cublas-fp8-tensorwise": baselines.cublas_tensorwise_fp8(a, b),
           "cublas-blockwise": baselines.cublas_blockwise_fp8(a, a_s, b, b_s),
           "cublas-bf16": baselines.bf16_mm(m, n, k)}
    for backend in ORDER[3:]:
        ops.scaled_mm(a, a_s, b, b_s, backend=backend)
        fns[backend] = lambda backend=backend: ops.scaled_mm(a, a_s, b, b_s, backend=backend)
    return fns


def serial(fns):
    """The bench before: the dense ceiling's GPU time alone, then each implementation's GPU time and eager loop."""
    out = {"cublas-fp8-tensorwise": (timing.gpu_time_us(fns["cublas-fp8-tensorwise"]), None)}
    for name in ORDER[1:]:
        out[name] = (timing.gpu_time_us(fns[name]), timing.eager_time_us(fns[name]))
    return out


def interleaved(fns):
    return dict(zip(ORDER, bench_run._times([fns[name] for name in ORDER])))


def main(path):
    rows = []
    for m in (4096, 16384):
        for n, k in SHAPES:
            fns = fns_for(m, n, k)
            for rnd in range(2):
                for protocol, measure in (("serial", serial), ("interleaved", interleaved)):
                    t0 = time.time()
                    times = measure(fns)
                    rows.append(dict(shape=[m, n, k], round=rnd, protocol=protocol, start=t0, end=time.time(),
                                     us={name: t[0] for name, t in times.items()},
                                     eager_us={name: t[1] for name, t in times.items()}))
                    us = rows[-1]["us"]
                    print(f"{m}x{n}x{k} {protocol:11s} r{rnd}: vendor {us['cublas-blockwise']:8.1f} "
                          f"torch[cublas] {us['torch[cublas]']:8.1f} gluon {us['triton[gluon]']:8.1f}  "
                          f"torch[cublas]/vendor {us['cublas-blockwise'] / us['torch[cublas]']:.3f}  "
                          f"vendor/gluon {us['cublas-blockwise'] / us['triton[gluon]']:.3f}", flush=True)
            del fns
            torch.cuda.empty_cache()
    json.dump(rows, open(path, "w"), indent=1)
    print("\nGeometric means over the 12 shapes and 2 rounds (GPU time; eager in brackets):")
    for protocol in ("serial", "interleaved"):
        sel = [r for r in rows if r["protocol"] == protocol]
        for name in ("torch[cublas]", "triton[gluon]", "triton"):
            g = statistics.geometric_mean([r["us"]["cublas-blockwise"] / r["us"][name] for r in sel])
            e = statistics.geometric_mean([r["eager_us"]["cublas-blockwise"] / r["eager_us"][name] for r in sel])
            lo = min(r["us"]["cublas-blockwise"] / r["us"][name] for r in sel)
            print(f"  {protocol:11s} vendor / {name:14s} {g:.3f} (eager {e:.3f}), lowest {lo:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
