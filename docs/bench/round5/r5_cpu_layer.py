"""Round-5 host probe on the CPU machine (no GPU): the Python cost of an eager QuantLinear call whose
launch does nothing (the kept plan's launch replaced by one returning a preallocated output), beside
nn.Linear with its real bf16 GEMM, torch.empty and a bare module call, under inference_mode.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round5/r5_cpu_layer.py
"""
import time

import torch

from quantcore import dispatch
from quantcore.nn import QuantLinear


def t(fn, n=20000):
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


lin = torch.nn.Linear(256, 64).to(torch.bfloat16).requires_grad_(False)
layer = QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)
x = torch.randn(1, 1, 256, dtype=torch.bfloat16)
with torch.inference_mode():
    layer(x)
    out = torch.empty(1, 64, dtype=torch.bfloat16)
    layer._site._plan = layer._site._plan._replace(launch=lambda **kw: out)
    ident = torch.nn.Identity()
    for name, fn in (("QuantLinear call, no-op launch", lambda: layer(x)), ("dispatch._state()", dispatch._state),
                     ("torch.empty((1, 1, 64))", lambda: torch.empty((1, 1, 64), dtype=torch.bfloat16, device=x.device)),
                     ("x.as_strided((1, 256), (256, 1))", lambda: x.as_strided((1, 256), (256, 1))),
                     ("out.reshape(1, 1, 64)", lambda: out.reshape(1, 1, 64)),
                     ("nn.Linear(256, 64) bf16 call", lambda: lin(x)), ("nn.Identity call", lambda: ident(x))):
        print(f"{name:36s} {t(fn):6.2f} us", flush=True)
