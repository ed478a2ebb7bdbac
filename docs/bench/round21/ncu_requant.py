"""Round-21 helper: six calls of one re-quantized Gluon GEMM (FP8 4096×32768×512; argv: configuration
"128/64", "wide" or "default" and the group, 0 for a bf16 output) for Nsight Compute (ncu_requant.sh)."""
import sys, torch
sys.path.insert(0, "docs/bench/round9")
from gluon_staged import operands, profile
from quantcore.backends.triton import gluon_launch as gll
cfg = {"128/64": gll.GluonConfig(sub_n=64), "wide": gll.WIDE[0], "default": gll.DEFAULT}[sys.argv[1]]
group = int(sys.argv[2])
a, a_s, w, w_s, bias = operands(4096, 32768, 512, torch.float8_e4m3fn)
run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.bfloat16,
                            out_quant=None if group == 0 else a.dtype, out_group=group or 128, ue8m0_out=False, eps=1e-4,
                            profile=profile, config=cfg)
for _ in range(6):
    run(a, a_s, w, w_s, None)
torch.cuda.synchronize()
