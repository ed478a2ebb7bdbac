"""Round-26 probe (H100): one plain or re-quantized Gluon GEMM on 128×256 in 64-column sub-tiles (`WIDE[0]`), 4096
rows, K = 7168, N = 2112 (a last column tile of one sub-tile) or 2048 (none), run five times for Nsight Compute:

    python3 docs/bench/round26/ncu_tail.py FMT N EPILOGUE      # FMT fp8|int8, EPILOGUE plain|rq

ncu_tail.txt: `ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --metrics
regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,gpu__time_duration.sum,smsp__inst_executed.sum,
sm__cycles_elapsed.avg,smsp__cycles_active.avg` on six cases.
"""
import sys, torch
from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll
fmt, N, rq = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "rq"
dt = torch.float8_e4m3fn if fmt == "fp8" else torch.int8
M, K = 4096, 7168
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=dt)
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=dt)
cfg = gll.WIDE[0]
run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                            out_dtype=torch.bfloat16, out_quant=dt if rq else None, out_group=128, ue8m0_out=False,
                            eps=1e-4, profile=capability.profile_for(a.device), config=cfg)
for _ in range(5):
    run(a, a_s, w, w_s)
torch.cuda.synchronize()
