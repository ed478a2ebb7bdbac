"""Issue 14: where does the Gluon GEMM spend more energy than cuBLAS's block-wise kernel (clock_probe.txt)?
One call of IMPL ("gluon": config_for's tile; "cublas") at M×N×K FP8, bf16 out, plain, run three times;
profile the last under Nsight Compute for its DRAM and L2 traffic and instruction count, e.g.

    ncu --clock-control none -k regex:'block_scaled_mm_ws|nvjet' --launch-skip 2 --launch-count 1 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,... python3 ncu_traffic.py gluon 4096 32768 512
"""
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines

impl, (M, N, K) = sys.argv[1], map(int, sys.argv[2:5])
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
b, b_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16))
if impl == "gluon":
    run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                               out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                               profile=capability.profile_for(a.device), config=gl.config_for(M, N, 128, None))
    call = lambda: run(a, a_s, b, b_s)  # noqa: E731
else:
    call = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
for _ in range(3):
    call()
torch.cuda.synchronize()
