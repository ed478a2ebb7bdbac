"""Round-4 probe (H100): eager (back-to-back) and GPU time per call of the Gluon GEMM after its shared-memory
layouts moved into the kept plan, beside the tiled Triton kernel, cuBLAS block-wise behind quantcore
(`torch[cublas]`) and the automatic choice, at M = 128 and 512.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round4/gluon_host.py
"""
import torch

from quantcore import ops
from quantcore.bench.timing import eager_time_us, gpu_time_us

for fmt in (torch.float8_e4m3fn, torch.int8):
    for M in (128, 512):
        for N, K in ((2112, 7168), (7168, 2048), (4096, 7168)):
            torch.manual_seed(0)
            a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=fmt)
            w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16), dtype=fmt)
            cells = []
            for backend in ("triton", "triton[gluon]", "torch[cublas]", None):
                if backend == "torch[cublas]" and fmt == torch.int8:
                    continue
                call = lambda: ops.scaled_mm(a, a_s, w, w_s, backend=backend)
                cells.append(f"{backend or 'auto'} {gpu_time_us(call):6.1f} / {eager_time_us(call):6.1f}")
            print(f"{str(fmt)[6:]:14s} {M}x{N}x{K} GPU / eager us: " + " | ".join(cells), flush=True)
