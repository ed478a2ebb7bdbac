"""Round-11 helper: six calls of quant_linear on the CuPy backend, the activation quantized once per
launch or by act_quant (two launches), for ncu to profile the last GEMM:

    ncu --clock-control none -k regex:gemm_kernel --launch-skip 5 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats python3 docs/bench/round11/once_cupy_ncu.py fp8 8 16384 4096 [once|two]
"""
import sys

import torch

from quantcore import ops
from quantcore.backends.cupy import launch

fmt, M, N, K = sys.argv[1], *map(int, sys.argv[2:5])
mode = sys.argv[5] if len(sys.argv) > 5 else "once"
launch.ONCE_M_MAX, launch.ONCE_NK_MAX = (64, 2**40) if mode == "once" else (0, 0)
qdtype = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
torch.manual_seed(0)
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=qdtype)
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
for _ in range(6):
    ops.quant_linear(x, w, w_s, backend="cupy")
torch.cuda.synchronize()
