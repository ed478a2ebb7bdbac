"""Round-36 probe (H100): one FP8 GEMM at M×N×K (bf16 out) by IMPL, run five times for Nsight Compute to profile the
last: "base" (config_for's Gluon kernel), "d12" (the same with no scale loads in the K loop) or "d0" (with no
promotion; both probe_variants.diff's tree, wrong by design), "cublas" (block-wise) or "cublas_tw" (tensor-wise). Usage: python3 promote_ncu.py IMPL M N K."""
import sys
from dataclasses import replace

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines

impl = sys.argv[1]
M, N, K = (int(v) for v in sys.argv[2:5])
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
b, b_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16))
if impl in ("base", "d12", "d0"):
    config = gl.config_for(M, N, K, 128, None)
    config = replace(config, depth={"base": config.depth, "d12": 12, "d0": 0}[impl])
    run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                               out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                               profile=capability.profile_for(a.device), config=config)
    call = lambda: run(a, a_s, b, b_s)  # noqa: E731
elif impl == "cublas":
    call = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
else:
    call = baselines.cublas_tensorwise_fp8(a, b)
for _ in range(5):
    call()
torch.cuda.synchronize()
