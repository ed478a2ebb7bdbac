"""Round-12 probe (H100): where an eager QuantLinear call's host time goes at 64 and 128 rows.

Per layer shape of the decode model (FP8 and INT8, [M, 1, K] input): how many calls re-plan
(`dispatch._prepare`) over 50 calls, the eager time per call beside the GPU time, and a cProfile of
200 back-to-back calls (top functions by own time).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round12/layer_profile.py
"""
import cProfile
import io
import pstats

import torch

from quantcore import capability, dispatch
from quantcore import nn as qnn
from quantcore.bench import decoder
from quantcore.bench.timing import eager_time_us, gpu_time_us

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), capability.versions(), flush=True)
count = [0]
_prepare = dispatch._prepare


def counted(*args, **kwargs):
    count[0] += 1
    return _prepare(*args, **kwargs)


dispatch._prepare = counted
with torch.inference_mode():
    for N, K, bias in ((4096, 4096, False), (16384, 4096, True)):
        torch.manual_seed(0)
        lin = decoder._linear(K, N, bias, dev)
        for qd in (torch.float8_e4m3fn, torch.int8):
            layer = qnn.QuantLinear.from_linear(lin, dtype=qd)
            for M in (64, 128):
                x = torch.randn(M, 1, K, device=dev, dtype=torch.bfloat16)
                fn = lambda: layer(x)
                fn()
                count[0] = 0
                for _ in range(50):
                    fn()
                replans = count[0]
                eager = [eager_time_us(fn, budget_s=0.3) for _ in range(3)]
                bf = [eager_time_us(lambda: lin(x), budget_s=0.3) for _ in range(3)]
                print(f"{qd} {M}x{N}x{K} bias={bias}: re-plans in 50 calls {replans}; eager us {eager} "
                      f"(bf16 {bf}); GPU us {gpu_time_us(fn):.1f}", flush=True)
                if M == 128 or qd == torch.float8_e4m3fn:
                    torch.cuda.synchronize()
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(200):
                        fn()
                    torch.cuda.synchronize()
                    prof.disable()
                    s = io.StringIO()
                    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
                    print(s.getvalue()[-3500:], flush=True)
