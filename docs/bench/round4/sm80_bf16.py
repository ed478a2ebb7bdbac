"""Round-4 probe (H100, simulating an A100 with quantcore.simulate("sm80")): torch[bf16_dequant] on its
device-kernel dequantization, under torch's default and with reduced-precision reductions forbidden,
beside the exact path the registry selects (triton[w8a16]) and the bf16 GEMM, at M = 128 and 4096.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round4/sm80_bf16.py
"""
import math, torch, quantcore
from quantcore import ops
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us
S = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
fl = torch.backends.cuda.matmul
for M in (128, 4096):
    r = {"d": [], "o": [], "w": []}
    for N, K in S:
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05)
        bf = gpu_time_us(baselines.bf16_mm(M, N, K))
        with quantcore.simulate("sm80"):
            call = lambda: ops.scaled_mm(a, a_s, w, w_s, backend="torch[bf16_dequant]")
            d = gpu_time_us(call)
            fl.allow_bf16_reduced_precision_reduction = False
            o = gpu_time_us(call)
            fl.allow_bf16_reduced_precision_reduction = True
            ex = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
            sel = quantcore.explain("scaled_mm", a, a_s, w, w_s).selected
        r["d"].append(bf / d); r["o"].append(bf / o); r["w"].append(bf / ex)
        print(f"sm80 M={M} {N}x{K}: bf16_dequant {d:.1f} ({bf/d:.2f}x) | fp32-reductions {o:.1f} ({bf/o:.2f}x) | exact {sel} {ex:.1f} ({bf/ex:.2f}x) | bf16 {bf:.1f}", flush=True)
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    print(f"sm80 M={M} geomean vs bf16: bf16_dequant {g(r['d']):.2f}, fp32-reductions {g(r['o']):.2f}, exact {g(r['w']):.2f}", flush=True)
