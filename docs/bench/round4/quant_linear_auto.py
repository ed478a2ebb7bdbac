"""Round-4 check (H100): a plain quant_linear now follows scaled_mm's measured ranking. For each case: what
the automatic selection runs, its GPU time beside the tiled Triton kernel's (the automatic choice before),
its output bit for bit the forced variant's, and its error against the torch reference.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round4/quant_linear_auto.py
"""
import torch

import quantcore
from quantcore import ops
from quantcore.bench.timing import gpu_time_us
from quantcore.specs.tolerances import rel_error

for fmt in (torch.float8_e4m3fn, torch.int8):
    for M in (128, 512, 4096):
        for N, K in ((2112, 7168), (7168, 2048), (24576, 1536)):
            torch.manual_seed(0)
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=fmt)
            label = quantcore.explain("quant_linear", x, w, w_s).selected
            auto = ops.quant_linear(x, w, w_s)
            same = torch.equal(auto, ops.quant_linear(x, w, w_s, backend=label))
            err = rel_error(auto.float(), ops.quant_linear(x, w, w_s, out_dtype=torch.float32, backend="torch"))
            t_auto = gpu_time_us(lambda: ops.quant_linear(x, w, w_s))
            t_tiled = gpu_time_us(lambda: ops.quant_linear(x, w, w_s, backend="triton"))
            print(f"{str(fmt)[6:]:14s} {M}x{N}x{K}: auto {label:14s} {t_auto:7.1f} us | tiled triton {t_tiled:7.1f} us "
                  f"| x{t_tiled / t_auto:.2f} | bit-equal forced {same} | rel err vs reference {err:.2e}", flush=True)
