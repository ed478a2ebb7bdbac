"""Round-26 probe (H100): one tile per program. 128×256 in 64-column sub-tiles (`WIDE[0]`), K = 7168, M = 16896
(132 row tiles: one per SM) and N = 64, 128 or 256 (one column tile keeping one, two or four sub-tiles), run five
times for Nsight Compute:

    python3 docs/bench/round26/ncu_one_tile.py FMT N M EPILOGUE      # e.g. fp8 64 16896 plain

ncu_one_tile.txt: `ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --metrics
gpu__time_duration.sum,smsp__inst_executed.sum`, and for N = 64 and 256 `--section SourceCounters --page source
--print-source sass --csv` summarized by docs/bench/round9/ncu_stalls.py (30 instructions).
"""
import sys, torch
from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll
fmt, N, M, rq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "rq"
dt = torch.float8_e4m3fn if fmt == "fp8" else torch.int8
K = 7168
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=dt)
w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=dt)
run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                            out_dtype=torch.bfloat16, out_quant=dt if rq else None, out_group=128, ue8m0_out=False,
                            eps=1e-4, profile=capability.profile_for(a.device), config=gll.WIDE[0])
for _ in range(5):
    run(a, a_s, w, w_s)
torch.cuda.synchronize()
