"""Round-9 probe (H100): where an eager decode step at batch 128 spends its host time.

Round 8's `--e2e` put eager FP8 at batch 128 at 0.62-0.64 of bf16 while the captured step ran at
1.01: the quantized step is bound by the host there. Three parts:

1. Per call, for the decode model's linears at M = 1, 8 and 128 (4096 -> 4096 without bias, 4096 ->
   16384 and 16384 -> 4096 with a bias): nn.Linear in bf16 and QuantLinear in FP8 and INT8, and at
   M = 128 the FP8 layer's two launches alone (ops.act_quant, ops.scaled_mm). "issue": host time of a
   loop of 200 calls with no synchronize inside it (the launch queue holds them all, so this is the
   host's cost per call); "eager": `timing.eager_time_us` (back to back, one synchronize at the end:
   the larger of host and GPU cost); "gpu": `timing.gpu_time_us`.
2. The decode step (dim 4096, 4 layers) at batch 128 in bf16, FP8 and INT8, eager: median of 7
   interleaved loops of 32 steps, host time per step when not synchronized inside the loop.
3. cProfile of 10 eager FP8 steps at batch 128 (top functions by own time).

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round9/eager128.py
"""
import copy
import cProfile
import io
import pstats
import statistics
import time

import torch
from torch import nn

from quantcore import ops
from quantcore import nn as qnn
from quantcore.bench import decoder, timing

dev = torch.device("cuda")


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


def layer(n_in, n_out, bias, qdtype):
    torch.manual_seed(0)
    lin = decoder._linear(n_in, n_out, bias, dev)
    if qdtype is None:
        return lin
    return qnn.quantize_model(nn.Sequential(copy.deepcopy(lin)), dtype=qdtype, skip=())[0]


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
print("\n1. per call (us): issue / eager / gpu")
with torch.inference_mode():
    for n_in, n_out, bias in ((4096, 4096, False), (4096, 16384, True), (16384, 4096, True)):
        for M in (1, 8, 128):
            x = torch.randn(M, 1, n_in, device=dev, dtype=torch.bfloat16)
            cells = []
            for name, qdtype in (("bf16", None), ("fp8", torch.float8_e4m3fn), ("int8", torch.int8)):
                mod = layer(n_in, n_out, bias, qdtype)
                f = lambda: mod(x)  # noqa: E731
                cells.append(f"{name} {issue_us(f):5.1f} / {timing.eager_time_us(f):5.1f} / "
                             f"{timing.gpu_time_us(f):5.1f}")
            if M == 128:
                mod = layer(n_in, n_out, bias, torch.float8_e4m3fn)
                x2 = x.view(M, n_in)
                a, a_s = ops.act_quant(x2)
                q = lambda: ops.act_quant(x2)  # noqa: E731
                g = lambda: ops.scaled_mm(a, a_s, mod.weight, mod.weight_scale_inv, bias=mod.bias)  # noqa: E731
                cells.append(f"act_quant {issue_us(q):5.1f} / {timing.eager_time_us(q):5.1f}")
                cells.append(f"scaled_mm {issue_us(g):5.1f} / {timing.eager_time_us(g):5.1f}")
            print(f"{n_in:5d}->{n_out:<5d} bias={bias!s:5s} M={M:3d}: " + " | ".join(cells), flush=True)

    print("\n2. decode step at batch 128, eager (us per step): median of 7 interleaved loops of 32 steps; host issue")
    torch.manual_seed(0)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    models = {"bf16": base, "fp8": qnn.quantize_model(copy.deepcopy(base), dtype=torch.float8_e4m3fn),
              "int8": qnn.quantize_model(copy.deepcopy(base), dtype=torch.int8)}
    steps = {}
    for name, m in models.items():
        state = decoder.DecodeState.new(m, 128, 256)
        steps[name] = (lambda m=m, state=state: decoder.decode_step(m, state))
        for _ in range(8):
            steps[name]()
    loops = {name: [] for name in steps}
    issues = {name: [] for name in steps}
    for _ in range(7):
        for name, step in steps.items():
            loops[name].append(timing.loop_us(step, 32))
            issues[name].append(issue_us(step, 16))
    for name in steps:
        step = statistics.median(loops[name])
        print(f"{name}: step {step:7.1f} (min {min(loops[name]):7.1f}); host issue "
              f"{statistics.median(issues[name]):7.1f}; bf16/this {statistics.median(loops['bf16']) / step:.2f}",
              flush=True)

    print("\n3. cProfile, 10 eager FP8 steps at batch 128")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(10):
        steps["fp8"]()
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())
