"""Host and GPU time per call of the CuPy backend's ops through `quantcore.ops` (branch cupy-fast).

Run on the H100 from the repository root:

    PYTHONPATH=$PWD OUT=/some/dir python3 /work/notes/cupy_probe.py

For each CuPy op at M = 1, 16 and 64 (x [M, 7168] bf16, weight 2112 x 7168 FP8 or INT8) it prints the
back-to-back eager time per call (`quantcore.bench.timing.eager_time_us`: a loop of calls, one
synchronize, what an eager decode loop pays) and the GPU time (`timing.gpu_time_us`: CUDA events, L2
flushed, host given a head start), beside: a bare CuPy RawKernel launch of a trivial kernel, the same
kernel through `quantcore.backends.cupy.launcher.Launcher`, one `torch.empty`, torch's bf16 linear,
and the kept plan's `run` of scaled_mm / quant_linear called directly (the backend's share of an
ops call; the rest is quantcore's dispatch); quant_linear is one launch up to M = 64 (the GEMM
quantizes x), and "act_quant + scaled_mm" beside it is the two-launch composition it replaces. Output goes to stdout and $OUT/cupy_probe.txt; every
cache (CuPy's, Triton's, XDG) is pointed under $OUT (default /tmp), so nothing is written elsewhere.
"""

import os

OUT = os.environ.get("OUT", "/tmp")
for var, sub in (("CUPY_CACHE_DIR", "cupy_cache"), ("TRITON_CACHE_DIR", "triton_cache"), ("XDG_CACHE_HOME", "cache")):
    os.environ.setdefault(var, os.path.join(OUT, sub))

import json  # noqa: E402

import cupy  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import quantcore  # noqa: E402
from quantcore import ops, registry  # noqa: E402
from quantcore.backends.cupy import launch, launcher  # noqa: E402
from quantcore.bench import timing  # noqa: E402

log = open(os.path.join(OUT, "cupy_probe.txt"), "w")
rows = []


def say(line: str) -> None:
    print(line, flush=True)
    log.write(line + "\n")
    log.flush()


def measure(name: str, fn) -> None:
    try:
        eager = timing.eager_time_us(fn, n=2000, budget_s=0.5)
        gpu = timing.gpu_time_us(fn)
        say(f"{name:<58} {eager:9.1f} {gpu:9.1f}")
        rows.append(dict(call=name, eager_us=eager, gpu_us=gpu))
    except Exception as err:  # report and go on: one failing call must not hide the others
        say(f"{name:<58} ERROR {type(err).__name__}: {str(err)[:300]}")
        rows.append(dict(call=name, error=f"{type(err).__name__}: {err}"))


def mma_of(op: str, *args) -> str:
    """The `mma` option of the CuPy variant that explain() names for this call."""
    named = quantcore.explain(op, *args, backend="cupy").selected
    fmt = "int8" if args[-2].dtype == torch.int8 else "fp8_e4m3"
    (impl,) = [i for i in registry.impls(op) if i.label == named and fmt in i.constraints.formats]
    return dict(impl.options)["mma"]


dev = torch.device("cuda")
prof = quantcore.profile_for(dev)
say(f"device {torch.cuda.get_device_name()} ({prof.arch}), torch {torch.__version__}, cupy {cupy.__version__}")
say(f"{'call':<58} {'eager us':>9} {'gpu us':>9}")

# A trivial kernel: CuPy's own launch, and quantcore's Launcher on the same function.
touch = cupy.RawKernel(r'extern "C" __global__ void touch(float* x, int n) {'
                       r' int i = threadIdx.x; if (i < n) x[i] += 1.0f; }', "touch")
buf = torch.zeros(128, device=dev)
stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream, dev.index or 0)
n128 = np.int32(128)
ptr = buf.data_ptr()
measure("bare cupy RawKernel call", lambda: touch((1,), (128,), (ptr, n128), stream=stream))
direct = launcher.Launcher(touch.kernel, (1,), (128,), (launcher.POINTER, launcher.i32(128)), dev.index or 0)
measure("launcher.Launcher, same kernel", lambda: direct(ptr))
measure("torch.empty 1x7168 fp8", lambda: torch.empty((1, 7168), dtype=torch.float8_e4m3fn, device=dev))

N, K = 2112, 7168
w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
quantized = {qd: ops.weight_quant(w, dtype=qd, backend="torch") for qd in (torch.float8_e4m3fn, torch.int8)}
measure(f"ops.weight_quant {N}x{K} fp8", lambda: ops.weight_quant(w, backend="cupy"))
wq8, ws8 = quantized[torch.float8_e4m3fn]
measure(f"ops.weight_dequant {N}x{K} fp8", lambda: ops.weight_dequant(wq8, ws8, backend="cupy"))

for M in (1, 16, 64):
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    q, s = ops.act_quant(x, backend="torch")
    g = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    sa, sb = torch.rand(M, device=dev), torch.rand(N, device=dev)
    bias = torch.randn(N, device=dev, dtype=torch.bfloat16)
    say(f"-- M = {M}")
    measure(f"torch bf16 F.linear {M}x{N}x{K}", lambda: F.linear(x, w))
    measure(f"ops.act_quant {M}x{K} fp8", lambda: ops.act_quant(x, backend="cupy"))
    measure(f"ops.act_dequant {M}x{K} fp8", lambda: ops.act_dequant(q, s, backend="cupy"))
    measure(f"ops.quantized_gelu {M}x{K} fp8", lambda: ops.quantized_gelu(q, s, backend="cupy"))
    measure(f"ops.dequant_bias {M}x{N} bf16 (+bias)", lambda: ops.dequant_bias(g, sa, sb, bias, backend="cupy"))
    for qd, name in ((torch.float8_e4m3fn, "fp8"), (torch.int8, "int8")):
        wq, ws = quantized[qd]
        a, a_s = ops.act_quant(x, dtype=qd, backend="torch")
        measure(f"ops.scaled_mm {name} {M}x{N}x{K}", lambda: ops.scaled_mm(a, a_s, wq, ws, backend="cupy"))
        measure(f"ops.scaled_mm {name} {M}x{N}x{K} +bf16 bias, silu",
                lambda: ops.scaled_mm(a, a_s, wq, ws, bias, activation="silu", backend="cupy"))
        measure(f"ops.quant_linear {name} {M}x{N}x{K}", lambda: ops.quant_linear(x, wq, ws, backend="cupy"))
        measure(f"ops.act_quant + ops.scaled_mm {name} {M}x{N}x{K}",
                lambda: ops.scaled_mm(*ops.act_quant(x, dtype=qd, backend="cupy"), wq, ws, backend="cupy"))
        mma = mma_of("scaled_mm", a, a_s, wq, ws)
        run = launch.scaled_mm.prepare(a, a_s, wq, ws, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, mma=mma, profile=prof)
        measure(f"  kept run of scaled_mm {name} (mma={mma}), no dispatch", lambda: run(a, a_s, wq, ws))
        run_ql = launch.quant_linear.prepare(x, wq, ws, block_n=128, block_k=128, bias=None, activation=None,
                                             out_dtype=torch.bfloat16, ue8m0=False, eps=1e-4, mma=mma, profile=prof)
        measure(f"  kept run of quant_linear {name}, no dispatch", lambda: run_ql(x, wq, ws))

with open(os.path.join(OUT, "cupy_probe.json"), "w") as f:
    json.dump(dict(device=torch.cuda.get_device_name(), versions=prof.versions, rows=rows), f, indent=1)
