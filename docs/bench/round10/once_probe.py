"""Round-10 probe (H100): quant_linear in one launch from 5 to 64 rows, the activation quantized once
per launch inside the decode GEMM (kernels/quantize_once.py), against act_quant + scaled_mm (two
launches) and, at 8 rows, against each program quantizing its own K range ("program").

For FP8 and INT8 weights, M in 8, 16, 32, 64, the six DeepSeek-V3 decode (N, K) and the decode model's
three (4096x4096, 16384x4096, 4096x16384): GPU time (`timing.gpu_time_us`) and eager time per call
(`timing.eager_time_us`, through `ops.quant_linear`) of each mode (forced through `configs.fused`,
plans reset in between), and whether the fused output is bit for bit the two launches'. Then the
decode model's three QuantLinear layers and bf16 nn.Linear at M = 16, 32, 64: host issue time per call.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round10/once_probe.py [out.json]
once_probe.txt: the kernel's first version (never committed: programs claimed every unclaimed block
at once), "program" also at 16 rows; once_probe2.txt: the final version.
"""
import json
import sys
import time

import torch

import quantcore
from quantcore import capability, ops, registry
from quantcore.backends.triton import configs
from quantcore.bench import timing

dev = torch.device("cuda")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512),
          (4096, 4096), (16384, 4096), (4096, 16384)]
real_fused = configs.fused


def forced(mode):
    registry.reset()
    configs.fused = (lambda profile, M, K: mode) if mode != "table" else real_fused


def issue_us(fn, n=200):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
rows = []
with torch.inference_mode():
    for qdtype in (torch.float8_e4m3fn, torch.int8):
        for N, K in SHAPES:
            torch.manual_seed(0)
            w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=qdtype)
            for M in (8, 16, 32, 64):
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
                row = dict(fmt=str(qdtype).split(".")[-1], M=M, N=N, K=K)
                outs = {}
                for mode in ("two", "program", "once"):
                    if mode == "program" and M > 8:
                        continue
                    forced(None if mode == "two" else mode)
                    call = lambda: ops.quant_linear(x, w, w_s, backend="triton")
                    outs[mode] = call()
                    row[f"{mode}_gpu"] = round(timing.gpu_time_us(call), 2)
                    row[f"{mode}_eager"] = round(timing.eager_time_us(call), 2)
                row["exact"] = all(torch.equal(o, outs["two"]) for o in outs.values())
                rows.append(row)
                print(row, flush=True)
    forced("table")
    print("\nlayers: host issue us per call (bf16 nn.Linear, QuantLinear fp8 / int8 with the table)")
    from torch import nn
    from quantcore import nn as qnn
    for n_in, n_out in ((4096, 4096), (4096, 16384), (16384, 4096)):
        torch.manual_seed(0)
        lin = nn.Linear(n_in, n_out, bias=n_out != n_in, device=dev, dtype=torch.bfloat16)
        layers = {"bf16": lin, **{str(q).split(".")[-1]: qnn.quantize_model(nn.Sequential(lin), dtype=q, skip=())[0]
                                  for q in (torch.float8_e4m3fn, torch.int8)}}
        for M in (16, 32, 64):
            x = torch.randn(M, 1, n_in, device=dev, dtype=torch.bfloat16)
            r = dict(layer=f"{n_in}->{n_out}", M=M, **{k: round(issue_us(lambda: m(x)), 1) for k, m in layers.items()},
                     **{f"{k}_gpu": round(timing.gpu_time_us(lambda: m(x)), 1) for k, m in layers.items()})
            rows.append(r)
            print(r, flush=True)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), versions=capability.versions(), rows=rows), f, indent=1)
