"""Round-30 probe (H100): one mc_gemm cubin (argv[1], named as mc.py reads names) at M×N×K (argv[2:5], default
4096×7168×16384), run five times, for Nsight Compute to profile the last (runs.sh)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["MC_CUBINS"] = sys.argv[1]
import mc  # noqa: E402
from quantcore import ops  # noqa: E402

M, N, K = (int(v) for v in sys.argv[2:5]) if len(sys.argv) > 4 else (4096, 7168, 16384)
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
b, b_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16))
run = mc.mc(a, a_s, b, b_s, sys.argv[1])
for _ in range(5):
    run()
torch.cuda.synchronize()
