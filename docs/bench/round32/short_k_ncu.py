"""Round-32 probe (H100): one Gluon GEMM at M×N×K (default 4096×32768×512, the bench shape where a bias with a
re-quantized output costs most over the plain GEMM) with epilogue EPI ("plain", "bias", "rq": re-quantized per
1×128, "brq": both) and format FMT (fp8 / int8), config_for's configuration, or with ":field=value,..." (ints)
replacing its fields; run five times, so that Nsight Compute profiles the last (short_k_ncu.sh).
Usage: python3 short_k_ncu.py FMT EPI[:field=value,...] [M N K]
"""
import dataclasses
import sys

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl

fmt = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}[sys.argv[1]]
epi, _, fields = sys.argv[2].partition(":")
M, N, K = (int(v) for v in sys.argv[3:6]) if len(sys.argv) > 5 else (4096, 32768, 512)
torch.manual_seed(0)
a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=fmt)
b, b_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=fmt)
bias = torch.randn(N, device="cuda", dtype=torch.bfloat16) if "b" in epi else None
requant = epi in ("rq", "brq")
config = gl.config_for(M, N, K, 128, 128 if requant else None)
if fields:
    config = dataclasses.replace(config, **{k: int(v) for k, v in (f.split("=") for f in fields.split(","))})
run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=bias, activation=None,
                           out_dtype=torch.bfloat16, out_quant=fmt if requant else None, out_group=128,
                           ue8m0_out=False, eps=1e-4, profile=capability.profile_for(a.device), config=config)
for _ in range(5):
    run(a, a_s, b, b_s, bias)
torch.cuda.synchronize()
print(config)
