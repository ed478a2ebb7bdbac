"""GPU time (bench timer, cold L2) of the Triton decode GEMM (ops.scaled_mm, backend triton) on the
DeepSeek-V3 decode shapes at M = 1 and 16, FP8 and INT8; PYTHONPATH picks the quantcore."""
import sys
import torch
from quantcore import ops
from quantcore.bench import timing
tag = sys.argv[1]
dev = "cuda"
torch.manual_seed(0)
NK = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
for qd in (torch.float8_e4m3fn, torch.int8):
    for m in (1, 16):
        cells = []
        for n, k in NK:
            w, ws = ops.weight_quant(torch.randn(n, k, device=dev, dtype=torch.bfloat16), dtype=qd)
            a, a_s = ops.act_quant(torch.randn(m, k, device=dev, dtype=torch.bfloat16), dtype=qd)
            f = lambda: ops.scaled_mm(a, a_s, w, ws, backend="triton")
            f()
            cells.append(f"{n}x{k} {timing.gpu_time_us(f):5.1f}")
        print(f"{tag} {str(qd)[6:]:13s} M={m:2d}: " + " | ".join(cells), flush=True)
