"""Round-14 probe (H100): one Gluon GEMM call under Nsight Compute, 4096x7168x2048 FP8, bf16 out.

    python3 docs/bench/round14/gluon_ncu.py EPILOGUE [field=value ...]

EPILOGUE: "plain" or "gelu" (a bf16 bias and GELU); the fields are `GluonConfig`'s (ints). The call runs
five times; profile the last, e.g.

    ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 \
        --section SchedulerStats --section WarpStateStats --section SourceCounters --page source \
        --print-source sass --csv python3 docs/bench/round14/gluon_ncu.py gelu epi_rows=8 > gelu.csv
    python3 docs/bench/round9/ncu_stalls.py gelu.csv 25
"""
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll

epilogue = sys.argv[1]
config = gll.GluonConfig(**{k: int(v) for k, v in (f.split("=") for f in sys.argv[2:])})
torch.manual_seed(0)
M, N, K = 4096, 7168, 2048
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if epilogue == "gelu" else None
run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=bias,
                            activation="gelu" if epilogue == "gelu" else None, out_dtype=torch.bfloat16,
                            out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4,
                            profile=capability.profile_for(a.device), config=config)
for _ in range(5):
    run(a, a_s, w, w_s, bias)
torch.cuda.synchronize()
