"""Round-10 helper: six calls of quant_linear on the Triton backend with the activation quantized once
per launch (forced), for ncu to profile the last:

    ncu --clock-control none -k regex:decode_mm --launch-skip 5 --launch-count 1 --section SpeedOfLight \
        python3 docs/bench/round10/once_ncu.py int8 8 2112 7168 [once|program|two]
"""
import sys

import torch

from quantcore import ops
from quantcore.backends.triton import configs

fmt, M, N, K = sys.argv[1], *map(int, sys.argv[2:5])
mode = sys.argv[5] if len(sys.argv) > 5 else "once"
configs.fused = lambda profile, m, k: None if mode == "two" else mode
qdtype = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
torch.manual_seed(0)
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=qdtype)
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
for _ in range(6):
    ops.quant_linear(x, w, w_s, backend="triton")
torch.cuda.synchronize()
