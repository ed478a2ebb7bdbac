"""Round-9 probe (H100): the Gluon GEMM with and without its GELU epilogue under Nsight Compute.

Round 8 measured bias + GELU at 2.96x the plain Gluon GEMM on 4096x7168x2048 FP8 (the tiled kernel
pays 1.51x), while the epilogue's SASS has no spills and ~70 instructions an element. This runs
`ops.scaled_mm(..., backend="triton[gluon]")` five times with `epilogue` ("plain" or "gelu": a bf16
bias and GELU) for ncu to profile the last call:

    ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 \
        --section WarpStateStats --section SchedulerStats --section SourceCounters \
        python3 docs/bench/round9/gluon_ncu.py gelu
"""
import sys

import torch

from quantcore import ops

epilogue = sys.argv[1] if len(sys.argv) > 1 else "plain"
torch.manual_seed(0)
M, N, K = 4096, 7168, 2048
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if epilogue == "gelu" else None
for _ in range(5):
    ops.scaled_mm(a, a_s, w, w_s, bias=bias, activation="gelu" if epilogue == "gelu" else None, backend="triton[gluon]")
torch.cuda.synchronize()
