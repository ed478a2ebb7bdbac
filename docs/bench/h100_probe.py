"""The probe behind docs/bench/h100-probe.txt and h100-decode-sweep.json (run on the lent H100 on
2026-11-23 as `PYTHONPATH=$PWD OUT=<dir> python3 docs/bench/h100_probe.py`): host time per call of
quantcore's ops and of torch's bf16 linear, eager (a back-to-back loop, one synchronize), replayed from
a CUDA graph, and GPU time (bench timing: L2 flushed, head start); then a sweep of the Triton decode
GEMM's tiles, stages and K splits on the DeepSeek-V3 shapes (FP8, M = 1 and 64), which chose the
`decode` rules of quantcore/backends/triton/configs/sm_90.json."""
import inspect, json, math, os, sys, time
import torch, triton
import torch.nn.functional as F
import quantcore
from quantcore import ops, registry
from quantcore.nn import QuantLinear
from quantcore.backends.triton import configs, launch, direct
from quantcore.bench import timing

OUT = os.environ.get("OUT", "/tmp")
log = open(f"{OUT}/probe.txt", "w")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

say("torch", torch.__version__, "triton", triton.__version__, "device", torch.cuda.get_device_name(), "direct", direct.enabled())
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction
with open(f"{OUT}/triton_src.txt", "w") as f:
    f.write(inspect.getsource(CompiledKernel)); f.write(inspect.getsource(JITFunction.run))

def eager_us(fn, n=400):
    for _ in range(30): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6

def graph_us(fn, n=400):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): fn()
    for _ in range(10): g.replay()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): g.replay()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6

bw = timing.copy_bandwidth_gbps()
say(f"copy bandwidth {bw:.0f} GB/s")
x1 = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
w = torch.randn(2112, 7168, device="cuda", dtype=torch.bfloat16)
wq, ws = ops.weight_quant(w); wi, wis = ops.weight_quant(w, dtype=torch.int8)
aq, a_s = ops.act_quant(x1)
lin = torch.nn.Linear(7168, 2112, bias=True, device="cuda", dtype=torch.bfloat16)
ql = QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)

import triton.language as tl
@triton.jit
def _touch(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
buf = torch.zeros(128, device="cuda")
lau = direct.Launcher(_touch, (1,), dict(BLOCK=128), buf.device)
calls = {
    "torch bf16 F.linear 1x2112x7168": lambda: F.linear(x1, w),
    "nn.Linear bf16 module 1x2112x7168 (+bias)": lambda: lin(x1),
    "bare triton kernel[grid]()": lambda: _touch[(1,)](buf, 128, BLOCK=128),
    "direct.Launcher same kernel": lambda: lau(buf, 128),
    "torch.empty x2": lambda: (torch.empty(1, 7168, dtype=torch.float8_e4m3fn, device="cuda"), torch.empty(1, 56, device="cuda")),
}
for be in ("triton",):
    calls[f"ops.act_quant 1x7168 [{be}]"] = lambda be=be: ops.act_quant(x1, backend=be)
    calls[f"ops.scaled_mm fp8 1x2112x7168 [{be}]"] = lambda be=be: ops.scaled_mm(aq, a_s, wq, ws, backend=be)
    calls[f"ops.quant_linear fp8 1x2112x7168 [{be}]"] = lambda be=be: ops.quant_linear(x1, wq, ws, backend=be)
    calls[f"ops.quant_linear int8 1x2112x7168 [{be}]"] = lambda be=be: ops.quant_linear(x1, wi, wis, backend=be)
calls["ops.quant_linear fp8 auto"] = lambda: ops.quant_linear(x1, wq, ws)
calls["torch.ops.quantcore.quant_linear fp8"] = lambda: torch.ops.quantcore.quant_linear(x1, wq, ws, None, block_size=[128, 128])
calls["QuantLinear module fp8 (+bias)"] = lambda: ql(x1)
say(f"{'call':<50} {'eager us':>9} {'graph us':>9} {'gpu us':>8}")
for name, fn in calls.items():
    try:
        e = eager_us(fn); g = graph_us(fn) if "bare" not in name and "direct" not in name else float("nan")
        gpu = timing.gpu_time_us(fn)
        say(f"{name:<50} {e:9.1f} {g:9.1f} {gpu:8.1f}")
    except Exception as err:
        say(f"{name:<50} ERROR {type(err).__name__}: {str(err)[:200]}")

# ---- decode sweep (v2: loop pipelined with tl.range)
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512)]
prof = quantcore.profile_for("cuda")
orig = configs.decode_config
rows = []
cp_bytes = 16 * 2**20
src = torch.empty(cp_bytes, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
say(f"copy of 8+8 MiB through the same timer: {timing.gpu_time_us(lambda: dst.copy_(src)):.1f} us")
for fmt, qd in (("fp8", torch.float8_e4m3fn),):
    for N, K in SHAPES:
        wv = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        bq, bs = ops.weight_quant(wv, dtype=qd)
        del wv
        for M in (1, 64):
            a, asc = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=qd)
            floor_us = (N * K + M * K + 2 * M * N + 4 * (math.ceil(N / 128) * math.ceil(K / 128) + M * math.ceil(K / 128))) / bw / 1e3
            res = {}
            cands = [(bn, st, wv_) for bn in (64, 128) for st in (4, 6, 8) for wv_ in (1, 2, 4)] if M == 1 else [(bn, st, wv_) for bn in (64, 128) for st in (3, 4) for wv_ in (1, 2)]
            for bn, st, waves in cands:
                kbs = math.ceil(K / 128); tiles = math.ceil(N / bn)
                split = max(1, min(round(waves * prof.sm_count / tiles), kbs // 2)); per = math.ceil(kbs / split); split = math.ceil(kbs / per)
                cfg = configs.DecodeConfig(max(16, 1 << (M - 1).bit_length()), bn, 4, st, split, per)
                configs.decode_config = lambda *a, cfg=cfg, **k: cfg
                try:
                    us = timing.gpu_time_us(lambda: launch.scaled_mm(a, asc, bq, bs, block_n=128, block_k=128, bias=None, activation=None, out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False, eps=1e-4, profile=prof, mma="fp8"))
                except Exception as err:
                    us = float("nan"); say("ERR", fmt, M, N, K, bn, st, waves, str(err)[:200])
                res[(bn, st, waves, split)] = us
                configs.decode_config = orig
            best = min(res, key=lambda c: res[c] if res[c] == res[c] else 1e9)
            say(f"{fmt} M={M:<3} N={N:<6} K={K:<6} floor {floor_us:6.1f} best {res[best]:6.1f} ({floor_us/res[best]:.2f} of floor) cfg bn,st,waves,split={best} | " + " ".join(f"{c[0]}/{c[1]}/{c[2]}:{v:.1f}" for c, v in res.items()))
            rows.append(dict(fmt=fmt, M=M, N=N, K=K, floor=floor_us, res={str(k): v for k, v in res.items()}))
json.dump(rows, open(f"{OUT}/sweep.json", "w"), indent=1)
