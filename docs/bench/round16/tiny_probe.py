"""Why the example's dim-2048 model (batch 8) decoded slower in FP8 than in bf16 eagerly: each of its
linears at M = 8 (x [8, 1, K], as the example calls them), back to back (`timing.loop_us`), bf16
nn.Linear against the FP8 QuantLinear, three interleaved rounds, median."""

from __future__ import annotations

import statistics

import torch
from torch import nn

from quantcore.bench import timing
from quantcore.nn import quantize_model

torch.manual_seed(0)
print("layer (M = 8)            bf16 µs   fp8 µs   fp8/bf16")
for n_in, n_out, bias in ((2048, 2048, False), (2048, 8192, True), (8192, 2048, True), (4096, 4096, False),
                          (4096, 16384, True), (16384, 4096, True), (256, 1024, True), (1024, 256, True)):
    dense = nn.Sequential(nn.Linear(n_in, n_out, bias=bias, device="cuda", dtype=torch.bfloat16)).requires_grad_(False)
    quant = quantize_model(nn.Sequential(nn.Linear(n_in, n_out, bias=bias, device="cuda", dtype=torch.bfloat16)),
                           dtype=torch.float8_e4m3fn).requires_grad_(False)
    x = torch.randn(8, 1, n_in, device="cuda", dtype=torch.bfloat16)
    times = {"bf16": [], "fp8": []}
    with torch.inference_mode():
        for _ in range(3):
            for name, m in (("bf16", dense), ("fp8", quant)):
                timing.loop_us(lambda: m(x), 50)
                times[name].append(timing.loop_us(lambda: m(x), 1000))
    b, q = (statistics.median(times[k]) for k in ("bf16", "fp8"))
    print(f"{n_in:5d}->{n_out:5d} bias={bias!s:5s}   {b:7.1f}  {q:7.1f}   {q / b:.3f}")
