"""Round-15 probe (H100): one decode-GEMM call (quant_linear at M = 1, FP8, bf16 in and out) under
Nsight Compute.

    python3 docs/bench/round15/decode_ncu.py N K

The call runs five times; profile the last, e.g.

    ncu --clock-control none -k regex:decode_mm --launch-skip 4 --launch-count 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats python3 docs/bench/round15/decode_ncu.py 4096 16384
"""
import sys

import torch

from quantcore import ops

N, K = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
for _ in range(5):
    ops.quant_linear(x, w, w_s)
torch.cuda.synchronize()
