"""Round-12 probe (H100): host issue time of a FP8 QuantLinear call at 64 and 128 rows (4096x4096) beside
bf16 nn.Linear, loops of 10, 50 and 200 calls (median of 9), and a cProfile of 200 FP8 calls at each M.
Run (before f047b9d) from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/issue128.py
"""
import cProfile, io, pstats, time, statistics
import torch
from quantcore import nn as qnn
from quantcore.bench import decoder
dev = torch.device("cuda")
def issue_us(fn, n):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6
with torch.inference_mode():
    lin = decoder._linear(4096, 4096, False, dev)
    layers = {"bf16": lin, "fp8": qnn.QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)}
    for M in (64, 128):
        x = torch.randn(M, 1, 4096, device=dev, dtype=torch.bfloat16)
        for name, L in layers.items():
            fn = lambda: L(x)
            for _ in range(10): fn()
            for n in (10, 50, 200):
                print(M, name, n, statistics.median(issue_us(fn, n) for _ in range(9)), flush=True)
        L = layers["fp8"]
        torch.cuda.synchronize()
        pr = cProfile.Profile(); pr.enable()
        for _ in range(20):
            for _ in range(10): L(x)
            torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12); print(s.getvalue()[-2500:])
