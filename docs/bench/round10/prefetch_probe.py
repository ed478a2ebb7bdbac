"""Round-10 probe (H100): GPU time of quant_linear with the activation quantized once per launch, with
each decode program first prefetching 0, 8 or 16 of its weight K blocks into L2 (`launch._PREFETCH_KB`)
while it waits for the codes, against act_quant + scaled_mm (two launches). FP8 and INT8, M = 8, 16
and 64, the nine (N, K) of once_probe.py; `timing.gpu_time_us`.

It ran with `prefetch.diff` applied (a `prefetch_l2` step before `quantize_once`); the step was
removed after this probe (docs/performance.md, round 10). Run from the repository root, with the diff
applied: PYTHONPATH=$PWD python3 docs/bench/round10/prefetch_probe.py [out.json]
"""
import json
import math
import sys

import torch

from quantcore import capability, ops, registry
from quantcore.backends.triton import configs, launch
from quantcore.bench import timing

dev = torch.device("cuda")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512),
          (4096, 4096), (16384, 4096), (4096, 16384)]
PREFETCH = (0, 8, 16)
real_fused = configs.fused
print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
rows, ratios = [], {p: {} for p in PREFETCH}
with torch.inference_mode():
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        for N, K in SHAPES:
            torch.manual_seed(0)
            w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=qdtype)
            for M in (8, 16, 64):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                call = lambda: ops.quant_linear(x, w, w_s, backend="triton")
                row = dict(fmt=str(qdtype).split(".")[-1], M=M, N=N, K=K)
                registry.reset()
                configs.fused = lambda profile, m, k: None
                want = call()
                row["two"] = round(timing.gpu_time_us(call), 2)
                configs.fused = lambda profile, m, k: "once"
                for p in PREFETCH:
                    registry.reset()
                    launch._PREFETCH_KB = p
                    assert torch.equal(call(), want)
                    row[f"once_pf{p}"] = round(timing.gpu_time_us(call), 2)
                    ratios[p].setdefault((row["fmt"], M), []).append(row[f"once_pf{p}"] / row["two"])
                rows.append(row)
                print(row, flush=True)
print("\nonce / two, geomean over the nine shapes")
for p in PREFETCH:
    print(f"prefetch {p:2d}:", {f"{f} M={m}": round(math.exp(sum(map(math.log, v)) / len(v)), 3) for (f, m), v in ratios[p].items()})
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), versions=capability.versions(), rows=rows), f, indent=1)
