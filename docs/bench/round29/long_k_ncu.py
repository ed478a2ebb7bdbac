"""Round-29 probe (H100): one plain FP8 GEMM at M×N×K (default 4096×7168×16384, bf16 out) by IMPL ("gluon":
config_for's tile; "cublas": block-wise `torch._scaled_mm`), run five times; profile the last under Nsight
Compute (long_k_ncu.sh): where the Gluon GEMM's main loop spends the cycles cuBLAS's does not.
IMPL "gluon:field=value,..." takes that `GluonConfig` (ints) instead of config_for's.
"""
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines

impl = sys.argv[1]
M, N, K = (int(v) for v in sys.argv[2:5]) if len(sys.argv) > 4 else (4096, 7168, 16384)
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
b, b_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16))
if impl.startswith("gluon"):
    fields = dict(f.split("=") for f in impl.split(":")[1].split(",")) if ":" in impl else None
    config = gl.GluonConfig(**{k: int(v) for k, v in fields.items()}) if fields else gl.config_for(M, N, K, 128, None)
    run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                               out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                               profile=capability.profile_for(a.device), config=config)
    call = lambda: run(a, a_s, b, b_s)  # noqa: E731
else:
    call = baselines.cublas_blockwise_fp8(a, a_s, b, b_s)
for _ in range(5):
    call()
torch.cuda.synchronize()
