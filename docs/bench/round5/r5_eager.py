"""Round-5 eager probe (H100): where an eager quantized decode step spends its host time.

(0) One Triton launch by each route (the decode kernel of a 1x4096x4096 FP8 quant_linear launched on
a one-program grid, so that the GPU never limits the loop): Triton's C launcher and
`CompiledKernel.run`. (The run in r5_eager.txt also timed `cuLaunchKernel` through ctypes on
parameters packed once per plan, `cudalaunch.DriverLaunch`, a module since removed: 7.42 / 7.47 us.)
(1) Per call, under inference_mode as `quantcore bench --e2e` runs, for the decoder's linears (3-D
input [B, 1, K], with and without bias): the host's issue time alone (a loop of 300 calls without
waiting for the GPU, best of 7) and the back-to-back time (the same loop closed by a synchronize:
max of host and GPU). nn.Linear in bf16 against QuantLinear in FP8 and INT8.
(2) cProfile of 20 eager decode steps of the e2e model (dim 4096, 4 layers, batch 1) in bf16 and
FP8: where the Python time goes.

Run from the repository root: PYTHONPATH=$PWD OUT=<dir> python3 docs/bench/round5/r5_eager.py
"""
import copy
import cProfile
import io
import os
import pstats
import sys
import time

import torch
from torch import nn

import quantcore.nn as qnn
from quantcore.bench import decoder

dev = torch.device("cuda")
OUT = os.environ.get("OUT", "/tmp")


def host_and_loop_us(fn, n=300, rounds=7):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    host = loop = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host, loop = min(host, (t1 - t0) / n * 1e6), min(loop, (t2 - t0) / n * 1e6)
    return host, loop


def launchers(obj):
    """The direct.Launcher objects reachable through the closures of `obj`."""
    from quantcore.backends.triton.direct import Launcher
    found, stack, seen = [], [obj], set()
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, Launcher):
            found.append(f)
            continue
        for cell in getattr(f, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:
                pass
    return found


def part_launch():
    from quantcore import dispatch, ops
    from quantcore.backends.triton.direct import Launcher, _kernel_view
    print("== one launch, one-program grid: host issue time / back-to-back time, us", flush=True)
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w, ws = ops.weight_quant(torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) * 0.05)
    call = lambda: ops.quant_linear(x, w, ws)
    call()
    call()
    seen, real = [], Launcher.__call__
    Launcher.__call__ = lambda self, *a: seen.append((self, a)) or real(self, *a)
    call()
    Launcher.__call__ = real
    launcher, args = seen[0]
    compiled = launcher.fn[launcher.grid](*map(_kernel_view, args), **launcher.constants)
    run, fn, packed, tail = compiled.run, compiled.function, compiled.packed_metadata, launcher._tail
    stream = torch._C._cuda_getCurrentRawStream
    one = (1, 1, 1)
    routes = {"CompiledKernel.run": lambda: run(*one, stream(0), fn, packed, None, None, None, *args, *tail)}
    c_launch = getattr(run, "launch", None)
    if c_launch is not None and hasattr(run, "launch_pdl"):
        head = (fn, run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None, None)
        routes["Triton C launcher"] = lambda: c_launch(*one, stream(0), *head, *args, *tail)
    for name, route in routes.items():
        try:
            h, l = host_and_loop_us(route)
            print(f"   {name:24s} {h:6.2f} / {l:6.2f}", flush=True)
        except Exception as e:
            print(f"   {name}: {type(e).__name__}: {e}", flush=True)
    print(f"   launcher straight to Triton's C launcher: {launcher.raw}", flush=True)


def part_ops():
    from quantcore import ops
    print("== quantcore.ops at M = 1 (issue 10's <= 12 us): host issue time / back-to-back time, us", flush=True)
    torch.manual_seed(0)
    x = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
    wf = torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16) * 0.05
    for backend in ("triton", "cupy"):
        for dt in (torch.float8_e4m3fn, torch.int8):
            try:
                a, a_s = ops.act_quant(x, dtype=dt, backend=backend)
                w, w_s = ops.weight_quant(wf, dtype=dt, backend=backend)
                calls = {
                    "act_quant 1x7168": lambda: ops.act_quant(x, dtype=dt, backend=backend),
                    "scaled_mm 1x2112x7168": lambda: ops.scaled_mm(a, a_s, w, w_s, backend=backend),
                    "quant_linear 1x2112x7168": lambda: ops.quant_linear(x, w, w_s, backend=backend),
                }
                cells = []
                for name, fn in calls.items():
                    h, l = host_and_loop_us(fn)
                    cells.append(f"{name} {h:5.1f} / {l:5.1f}")
                print(f"   {backend} {str(dt)[6:]}: " + " | ".join(cells), flush=True)
            except Exception as e:
                print(f"   {backend} {dt}: {type(e).__name__}: {e}", flush=True)
    lin = torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16)
    h, l = host_and_loop_us(lambda: torch.nn.functional.linear(x, lin))
    print(f"   torch bf16 F.linear 1x2112x7168: {h:5.1f} / {l:5.1f}", flush=True)


def part_calls():
    from quantcore import ops
    print("== per call under inference_mode: host issue time / back-to-back time, us", flush=True)
    torch.manual_seed(0)
    for K, N, bias in ((4096, 4096, False), (4096, 16384, True), (16384, 4096, True)):
        lin = nn.Linear(K, N, bias=bias, device=dev, dtype=torch.bfloat16).requires_grad_(False)
        layers = {"bf16 nn.Linear": lin}
        for name, dt in (("fp8 QuantLinear", torch.float8_e4m3fn), ("int8 QuantLinear", torch.int8)):
            layers[name] = layer = qnn.QuantLinear.from_linear(lin, dtype=dt)
            layers[name.replace("QuantLinear", "ops.quant_linear")] = (
                lambda x, q=layer: ops.quant_linear(x, q.weight, q.weight_scale_inv, q.bias, out_dtype=x.dtype))
        for B in (1, 8):
            x = torch.randn(B, 1, K, device=dev, dtype=torch.bfloat16)
            cells = []
            with torch.inference_mode():
                for name, layer in layers.items():
                    h, l = host_and_loop_us(lambda: layer(x))
                    cells.append(f"{name} {h:5.1f} / {l:5.1f}")
            print(f"   B={B} {K}->{N} bias={bias}: " + " | ".join(cells), flush=True)


def part_profile():
    print("== cProfile of 20 eager decode steps (dim 4096, 4 layers, batch 1)", flush=True)
    torch.manual_seed(0)
    base = decoder.DecodeModel(4096, 4, 32000, dev)
    for name, dt in (("bf16", None), ("fp8", torch.float8_e4m3fn)):
        with torch.no_grad():
            model = base if dt is None else qnn.quantize_model(copy.deepcopy(base), dtype=dt)
        state = decoder.DecodeState.new(model, 1, 256)
        with torch.inference_mode():
            for _ in range(10):
                decoder.decode_step(model, state)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                decoder.decode_step(model, state)
            torch.cuda.synchronize()
            plain = (time.perf_counter() - t0) / 20 * 1e6
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                decoder.decode_step(model, state)
            torch.cuda.synchronize()
            prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        print(f"-- {name}: {plain:.0f} us per step without the profiler", flush=True)
        text = s.getvalue()
        print(text[:9000], flush=True)
        with open(f"{OUT}/profile_{name}.txt", "w") as f:
            f.write(text)
        if dt is not None:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumtime").print_stats(40)
            with open(f"{OUT}/profile_{name}_cum.txt", "w") as f:
                f.write(s.getvalue())
        del model, state
        torch.cuda.empty_cache()


parts = set(sys.argv[1:]) or {"launch", "ops", "calls", "profile"}
if "launch" in parts:
    part_launch()
if "ops" in parts:
    part_ops()
if "calls" in parts:
    part_calls()
if "profile" in parts:
    part_profile()
