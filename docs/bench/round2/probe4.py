"""Device probe 4: host-time breakdown of one quantized linear call; fused quant_linear after the
QROWS prologue vs act_quant + scaled_mm; the read-flush timer."""
import json, math, os, statistics, time
import torch, triton
import torch.nn.functional as F
import quantcore
from quantcore import ops, dispatch, registry, capability
from quantcore.nn import QuantLinear
from quantcore.bench import timing

OUT = os.environ.get("OUT", "/tmp")
log = open(f"{OUT}/probe4.txt", "w")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

def best_us(fn, n=2000, rounds=5):
    for _ in range(100): fn()
    b = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize(); b = min(b, (time.perf_counter() - t) / n * 1e6)
    return b

dev = "cuda"
say("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
# host breakdown on a small layer (GPU time ~3 us) so host cost shows
K = N = 512
x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
lin = torch.nn.Linear(K, N, bias=True, device=dev, dtype=torch.bfloat16)
ql = QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)
w, ws, b = ql.weight, ql.weight_scale_inv, ql.bias
ops.quant_linear(x, w, ws, b, out_dtype=torch.bfloat16, block_size=(128, 128))
args = (x, w, ws, b)
opts = dict(activation=None, out_dtype=torch.bfloat16, block_size=(128, 128), scale_fmt="fp32", eps=1e-4)
key = dispatch._key("quant_linear", args, opts, None)
plan = dispatch._plans[key]
kw = {name: args[i] for name, i, v in plan.bindings}
empty2 = lambda: (torch.empty((1, N), dtype=torch.bfloat16, device=dev),)
import quantcore.backends.triton.launch as tl_launch
rows = {
    "torch.empty (1 tensor)": lambda: torch.empty((1, N), dtype=torch.bfloat16, device=dev),
    "F.linear bf16 512": lambda: F.linear(x, lin.weight, lin.bias),
    "nn.Linear module bf16 512": lambda: lin(x),
    "dispatch._key": lambda: dispatch._key("quant_linear", args, opts, None),
    "key + plans.get": lambda: dispatch._plans.get(dispatch._key("quant_linear", args, opts, None)),
    "plan.launch(**kw) (prepared run)": lambda: plan.launch(**kw),
    "dispatch.call": lambda: dispatch.call("quant_linear", args, opts, None),
    "ops.quant_linear": lambda: ops.quant_linear(x, w, ws, b, out_dtype=torch.bfloat16, block_size=(128, 128)),
    "QuantLinear.forward": lambda: ql.forward(x),
    "QuantLinear module": lambda: ql(x),
    "registry.epoch()": registry.epoch,
    "capability.simulation_state()": capability.simulation_state,
    "registry.priority_state()": registry.priority_state,
    "_signature(x)": lambda: dispatch._signature(x),
    "torch.compiler.is_compiling()": torch.compiler.is_compiling,
}
say("\n== host breakdown, best of 5 x 2000 back-to-back calls (us/call)")
for name, fn in rows.items():
    say(f"{name:<40} {best_us(fn):7.2f}")

say("\n== fused quant_linear vs act_quant + scaled_mm, read-flush timer (us)")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512), (4096, 4096), (16384, 4096), (4096, 16384)]
bw = timing.copy_bandwidth_gbps()
say(f"copy bw {bw:.0f} GB/s")
res = []
for N_, K_ in SHAPES:
    wv = torch.randn(N_, K_, device=dev, dtype=torch.bfloat16)
    bq, bs = ops.weight_quant(wv); del wv
    for M in (1, 8, 16, 64):
        xx = torch.randn(M, K_, device=dev, dtype=torch.bfloat16)
        a, asc = ops.act_quant(xx)
        fl = (N_ * K_ + 2 * M * K_ + 2 * M * N_ + 4 * math.ceil(N_ / 128) * math.ceil(K_ / 128)) / bw / 1e3
        r = dict(N=N_, K=K_, M=M, floor=fl,
                 fused=timing.gpu_time_us(lambda: ops.quant_linear(xx, bq, bs)),
                 composed=timing.gpu_time_us(lambda: ops.scaled_mm(*ops.act_quant(xx), bq, bs)),
                 scaled_mm=timing.gpu_time_us(lambda: ops.scaled_mm(a, asc, bq, bs)))
        res.append(r)
        say(f"M={M:<3} {N_:>6}x{K_:<6} floor {fl:6.1f}  fused {r['fused']:6.1f} ({fl/r['fused']:.2f})  composed {r['composed']:6.1f}  scaled_mm {r['scaled_mm']:6.1f} ({fl/r['scaled_mm']:.2f})")
json.dump(res, open(f"{OUT}/probe4.json", "w"), indent=1)
