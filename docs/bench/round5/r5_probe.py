"""Round-5 probe (H100): (A) where an eager quantized Linear's host time goes, piece by piece; (B) the
exact W8A16 GEMM (FP8 data as simulate("sm80") runs it) at M = 4096 under each tile candidate, beside
the bf16 GEMM; (C) the Gluon GEMM's fused epilogues against its plain bf16 output.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round5/r5_probe.py [A] [B] [C]
Host times: best of 5 rounds of 2000 back-to-back calls (quantcore.bench.timing.loop_us).
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import math
import sys
import traceback

import torch
import torch.nn.functional as F

import quantcore
import quantcore.nn
from quantcore import dispatch, ops
from quantcore.backends.triton import configs
from quantcore.backends.triton.direct import Launcher
from quantcore.bench import baselines
from quantcore.bench.timing import gpu_time_us, loop_us

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
dev = "cuda"
parts = set(sys.argv[1:]) or {"A", "B", "C"}


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def host_us(fn, n=2000, rounds=5):
    for _ in range(50):
        fn()
    return min(loop_us(fn, n) for _ in range(rounds))


def launchers(obj):
    """The Launcher objects reachable through the closures of `obj`."""
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


def recorded_args(launcher, call):
    """The arguments `call()` passes to `launcher`."""
    seen = []
    original = Launcher.__call__

    def spy(self, *args):
        if self is launcher:
            seen.append(args)
        return original(self, *args)
    Launcher.__call__ = spy
    try:
        call()
    finally:
        Launcher.__call__ = original
    return seen[0]


def part_a():
    print("== A: host time per call, us (M = 1, 4096x4096 FP8 unless named)", flush=True)
    torch.manual_seed(0)
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w, ws = ops.weight_quant(torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) * 0.05)
    d0 = torch.device("cuda", 0)
    rows = [
        ("torch.empty(shape, dtype, device='cuda')", lambda: torch.empty((1, 4096), dtype=torch.bfloat16, device="cuda")),
        ("torch.empty(shape, dtype, device=torch.device)", lambda: torch.empty((1, 4096), dtype=torch.bfloat16, device=d0)),
        ("x.new_empty(shape)", lambda: x.new_empty((1, 4096))),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
    ]
    call = lambda: ops.quant_linear(x, w, ws, out_dtype=torch.bfloat16)
    with torch.no_grad():
        call()
        captured = {}
        original = dispatch.call

        def spy(op, args, options, backend):
            captured["c"] = (op, args, options, backend)
            return original(op, args, options, backend)
        ops.quant_linear.__globals__["_call"] = spy
        call()
        ops.quant_linear.__globals__["_call"] = original
        op, args, options, backend = captured["c"]
        key = dispatch._key(op, args, options, backend)
        plan = dispatch._plans[key]
        kwargs = dict(plan.static)
        for name, index, view in plan.bindings:
            kwargs[name] = args[index]
        rows += [
            ("dispatch._key (quant_linear)", lambda: dispatch._key(op, args, options, backend)),
            ("dispatch._key + plan lookup", lambda: dispatch._plans.get(dispatch._key(op, args, options, backend))),
            ("plan.launch(**kwargs) (no dispatch)", lambda: plan.launch(**kwargs)),
            ("ops.quant_linear (one launch)", call),
        ]
        (launcher,) = launchers(plan.launch)
        largs = recorded_args(launcher, lambda: plan.launch(**kwargs))
        rows.append(("Launcher(*args) (compiled.run)", lambda: launcher(*largs)))
        cl = launcher._run
        print(f"   launcher: {type(cl).__name__}, global scratch {getattr(cl, 'global_scratch_size', '?')}, "
              f"profile scratch {getattr(cl, 'profile_scratch_size', '?')}", flush=True)
        if hasattr(cl, "launch") and getattr(cl, "global_scratch_size", 1) == 0 and getattr(cl, "profile_scratch_size", 1) == 0:
            raw = cl.launch
            g, fn, packed, tail = launcher.grid, launcher._function, launcher._packed, launcher._tail
            coop, pdl = cl.launch_cooperative_grid, cl.launch_pdl
            stream = torch.cuda.current_stream().cuda_stream
            head = (*g, stream, fn, coop, pdl, None, None, packed, None, None, None)
            try:
                raw(*head, *largs, *tail)
                rows.append(("raw C launch (Triton 3.6 internals), tensors", lambda: raw(*head, *largs, *tail)))
                ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in largs)
                rows.append(("raw C launch, int pointers", lambda: raw(*head, *ints, *tail)))
                rows.append(("stream handle (_cuda_getCurrentRawStream)", lambda: torch._C._cuda_getCurrentRawStream(0)))
            except Exception:
                traceback.print_exc()
        layer = quantcore.nn.QuantLinear.from_linear(torch.nn.Linear(4096, 4096, bias=False).to(dev, torch.bfloat16),
                                                     dtype=torch.float8_e4m3fn)
        rows.append(("QuantLinear(4096, 4096) module call", lambda: layer(x)))
        lin = torch.nn.Linear(4096, 4096, bias=False).to(dev, torch.bfloat16)
        rows += [("nn.Linear bf16 module call", lambda: lin(x)), ("F.linear bf16", lambda: F.linear(x, lin.weight))]
        # Gluon: the per-call TMA descriptor work, at M = 128.
        try:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
            from triton.backends.nvidia.driver import make_tensordesc_arg
            from quantcore.backends.triton import gluon_launch
            a, a_s = ops.act_quant(torch.randn(128, 4096, device=dev, dtype=torch.bfloat16))
            g_call = lambda: ops.scaled_mm(a, a_s, w, ws, backend="triton[gluon]")
            g_call()
            lay = gluon_launch._layout([128, 128], torch.float8_e4m3fn)
            rows.append(("Gluon: TensorDescriptor.from_tensor", lambda: TensorDescriptor.from_tensor(w, [128, 128], lay)))
            gkey = dispatch._key("scaled_mm", (a, a_s, w, ws, None), captured_options(a, a_s, w, ws), "triton[gluon]")
            gplan = dispatch._plans.get(gkey)
            if gplan is not None:
                (gl_launcher,) = launchers(gplan.launch)
                inner = gl_launcher._run.launch
                cells = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in inner.__closure__)))
                meta = cells.get("tensordesc_meta")
                desc = TensorDescriptor.from_tensor(w, [128, 128], lay)
                if meta:
                    rows.append(("Gluon: make_tensordesc_arg (encode)", lambda: make_tensordesc_arg(desc, meta[1])))
            rows.append(("Gluon scaled_mm M=128 (full call)", g_call))
        except Exception:
            traceback.print_exc()
        for name, fn in rows:
            try:
                print(f"   {name:55s} {host_us(fn):7.2f}", flush=True)
            except Exception:
                traceback.print_exc()


def captured_options(a, a_s, w, ws):
    captured = {}
    original = dispatch.call

    def spy(op, args, options, backend):
        captured["o"] = options
        return original(op, args, options, backend)
    ops.scaled_mm.__globals__["_call"] = spy
    ops.scaled_mm(a, a_s, w, ws, backend="triton[gluon]")
    ops.scaled_mm.__globals__["_call"] = original
    return captured["o"]


def part_b():
    print("== B: exact W8A16 (simulate sm80), M = 4096, FP8 data: us (bf16 GEMM time / it)", flush=True)
    M = 4096
    cands = [None, [128, 128, 8, 2], [128, 128, 4, 2], [64, 128, 4, 3], [128, 64, 4, 3], [64, 256, 8, 2],
             [256, 64, 8, 2], [64, 64, 4, 4], [128, 256, 8, 1]]
    ratios = {str(c): [] for c in cands}
    for N, K in SHAPES:
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16))
        w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05)
        bf = gpu_time_us(baselines.bf16_mm(M, N, K))
        ref = None
        cells = []
        with quantcore.simulate("sm80"):
            table = configs._table("sm_80")
            rule = next(r for r in table["gemm"] if r.get("mma") == "fp16_predecoded")
            shipped, limit = list(rule["configs"]), table["predecode"]["max_bytes"]
            for c in cands:
                try:
                    table["predecode"]["max_bytes"] = limit if c is None else 1 << 31
                    rule["configs"] = shipped if c is None else [c]
                    configs.gemm_candidates.cache_clear()
                    dispatch._plans.clear()
                    call = lambda: ops.scaled_mm(a, a_s, w, w_s)
                    out = call()
                    same = "" if ref is None else ("" if torch.equal(out, ref) else " DIFF")
                    ref = out if ref is None else ref
                    t = gpu_time_us(call)
                    ratios[str(c)].append(bf / t)
                    cells.append(f"{'shipped' if c is None else c}: {t:.0f} ({bf / t:.2f}){same}")
                except Exception as e:
                    cells.append(f"{c}: {type(e).__name__}")
            rule["configs"], table["predecode"]["max_bytes"] = shipped, limit
            configs.gemm_candidates.cache_clear()
            dispatch._plans.clear()
        print(f"   {M}x{N}x{K} bf16 {bf:.0f} | " + " | ".join(cells), flush=True)
    for c, r in ratios.items():
        print(f"   geomean bf16/it {'shipped' if c == 'None' else c}: {geomean(r):.2f} over {len(r)}", flush=True)


def part_c():
    print("== C: Gluon GEMM, fused epilogue time / plain bf16 output time (GPU)", flush=True)
    for fmt in (torch.float8_e4m3fn, torch.int8):
        for M in (512, 4096):
            ratios = {}
            for N, K in SHAPES:
                torch.manual_seed(0)
                a, a_s = ops.act_quant(torch.randn(M, K, device=dev, dtype=torch.bfloat16), dtype=fmt)
                w, w_s = ops.weight_quant(torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05, dtype=fmt)
                bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
                g = "triton[gluon]"
                variants = {
                    "plain": lambda: ops.scaled_mm(a, a_s, w, w_s, backend=g),
                    "bias": lambda: ops.scaled_mm(a, a_s, w, w_s, bias=bias, backend=g),
                    "bias+silu": lambda: ops.scaled_mm(a, a_s, w, w_s, bias=bias, activation="silu", backend=g),
                    "gelu": lambda: ops.scaled_mm(a, a_s, w, w_s, activation="gelu", backend=g),
                    "fp32 out": lambda: ops.scaled_mm(a, a_s, w, w_s, out_dtype=torch.float32, backend=g),
                    "requant": lambda: ops.scaled_mm(a, a_s, w, w_s, out_quant=fmt, backend=g),
                }
                times = {}
                for name, fn in variants.items():
                    try:
                        times[name] = gpu_time_us(fn)
                    except Exception as e:
                        print(f"   {name}: {type(e).__name__}: {e}", flush=True)
                base = times["plain"]
                for name, t in times.items():
                    ratios.setdefault(name, []).append(t / base)
                print(f"   {str(fmt)[6:]} {M}x{N}x{K}: " + " | ".join(f"{n} {t:.1f} ({t / base:.3f})" for n, t in times.items()),
                      flush=True)
            print(f"   {str(fmt)[6:]} M={M} geomean time/plain: " + ", ".join(
                f"{n} {geomean(r):.3f} (max {max(r):.3f})" for n, r in ratios.items()), flush=True)


for name, fn in (("A", part_a), ("B", part_b), ("C", part_c)):
    if name in parts:
        try:
            fn()
        except Exception:
            traceback.print_exc()
