"""Eager time per `quantcore.ops` call at 1 row, back to back (`timing.loop_us` of 2000 calls), ROUNDS
rounds with the cases' order rotating, median and min per case, for the Triton and CuPy backends; printed as
JSON lines tagged with argv[1] (the code version; host_probe.sh runs it). With argv[2] == "parts", also each
case's GPU time (`timing.gpu_times_us`) and a breakdown: a kept plan's launch alone beside the whole call,
the allocator, torch.empty, the stream read, data_ptr, one tensor's signature, a direct Launcher call with
its outputs preallocated and the Triton C launcher on prebuilt arguments."""
import json, statistics, sys
import torch
from quantcore import ops, dispatch
from quantcore.bench import timing

tag, parts = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "parts"
ROUNDS, N = 3, 2000
dev = "cuda"
torch.manual_seed(0)
x7 = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
q, s = ops.act_quant(x7)
qi, si = ops.act_quant(x7, dtype=torch.int8)
g = torch.randn(1, 2560, device=dev).to(torch.bfloat16)
sa, sb, bias = torch.rand(1, device=dev), torch.rand(2560, device=dev), torch.randn(2560, device=dev).to(torch.bfloat16)
w, ws = ops.weight_quant(torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16))
wi, wsi = ops.weight_quant(torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16), dtype=torch.int8)
x4 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
w4, ws4 = ops.weight_quant(torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16))
# A GEMM whose GPU time is short (0.5 MB of weight): its loop time is the host's.
x1k = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
qs, ss = ops.act_quant(x1k)
ws_, wss = ops.weight_quant(torch.randn(512, 1024, device=dev, dtype=torch.bfloat16))
bias512 = torch.randn(512, device=dev).to(torch.bfloat16)
cases = {}
for be in ("triton", "cupy"):
    cases.update({
        f"{be} act_quant fp8": lambda be=be: ops.act_quant(x7, backend=be),
        f"{be} act_quant int8": lambda be=be: ops.act_quant(x7, dtype=torch.int8, backend=be),
        f"{be} act_dequant": lambda be=be: ops.act_dequant(q, s, backend=be),
        f"{be} quantized_gelu": lambda be=be: ops.quantized_gelu(q, s, backend=be),
        f"{be} dequant_bias bias": lambda be=be: ops.dequant_bias(g, sa, sb, bias, backend=be),
        f"{be} dequant_bias none": lambda be=be: ops.dequant_bias(g, sa, sb, backend=be),
        f"{be} scaled_mm fp8 1x2112x7168": lambda be=be: ops.scaled_mm(q, s, w, ws, backend=be),
        f"{be} scaled_mm int8 1x2112x7168": lambda be=be: ops.scaled_mm(qi, si, wi, wsi, backend=be),
        f"{be} quant_linear fp8 1x4096x4096": lambda be=be: ops.quant_linear(x4, w4, ws4, backend=be),
        f"{be} scaled_mm fp8 1x512x1024": lambda be=be: ops.scaled_mm(qs, ss, ws_, wss, backend=be),
        f"{be} scaled_mm fp8 1x512x1024 bias": lambda be=be: ops.scaled_mm(qs, ss, ws_, wss, bias=bias512, backend=be),
        f"{be} quant_linear fp8 1x512x1024": lambda be=be: ops.quant_linear(x1k, ws_, wss, backend=be),
        f"{be} quant_linear fp8 1x512x1024 bias": lambda be=be: ops.quant_linear(x1k, ws_, wss, bias512, backend=be),
    })
qc = torch.ops.quantcore  # the custom ops, grad mode on, no input requiring grad (the Autograd kernel runs)
cases["custom op act_quant fp8"] = lambda: qc.act_quant(x7)
cases["custom op scaled_mm fp8 1x512x1024"] = lambda: qc.scaled_mm(qs, ss, ws_, wss, None)
cases["custom op quant_linear fp8 1x512x1024"] = lambda: qc.quant_linear(x1k, ws_, wss, None)
cases["torch F.linear bf16 1x4096x4096"] = lambda wb=torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16): torch.nn.functional.linear(x4, wb)
for fn in cases.values():
    fn(); fn()
res = {k: [] for k in cases}
for r in range(ROUNDS):
    names = list(cases)
    names = names[r % len(names):] + names[:r % len(names)]
    for name in names:
        res[name].append(timing.loop_us(cases[name], N))
gpu = dict(zip(cases, timing.gpu_times_us(list(cases.values())))) if parts else {}
for name, v in res.items():
    print(json.dumps({"tag": tag, "case": name, "median_us": round(statistics.median(v), 2), "min_us": round(min(v), 2),
                      **({"gpu_us": round(gpu[name], 2)} if name in gpu else {})}))
if parts:
    import timeit
    def per_call(f, n=20000):
        return min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6
    def show(name, us):
        print(json.dumps({"tag": tag, "part": name, "us": round(us, 3)}))
    for label, op, args, fn in [("act_quant fp8", "act_quant", (x7,), cases["triton act_quant fp8"]),
                                ("act_dequant", "act_dequant", (q, s), cases["triton act_dequant"]),
                                ("dequant_bias bias", "dequant_bias", (g, sa, sb, bias), cases["triton dequant_bias bias"])]:
        keys = [k for k in dispatch._plans if k[0] == op and k[1] == "triton"]
        plan = dispatch._plans[keys[0]]
        show(f"{label}: plans kept {len(keys)}, direct {plan.direct}", 0)
        run = plan.launch
        k = plan.direct
        show(f"{label}: plan.launch alone", timing.loop_us(lambda: run(*args[:k]), N))
        show(f"{label}: whole call", timing.loop_us(fn, N))
    from quantcore.backends.base import allocator
    new = allocator((1, 7168), torch.float8_e4m3fn, torch.device(dev))
    show("allocator (1x7168 fp8)", per_call(new))
    show("torch.empty (1x7168 fp8)", per_call(lambda: torch.empty((1, 7168), dtype=torch.float8_e4m3fn, device=dev)))
    show("_cuda_getCurrentRawStream", per_call(lambda: torch._C._cuda_getCurrentRawStream(0)))
    show("data_ptr", per_call(lambda: x7.data_ptr()))
    show("signature of one tensor", per_call(lambda: (x7.dtype, x7.shape, x7.stride(), x7.device, x7.data_ptr() & 15)))
    # The act_dequant plan's Launcher called with preallocated outputs: the launch floor.
    from quantcore.backends.triton import direct
    import gc
    ls = [o for o in gc.get_objects() if isinstance(o, direct.Launcher) and o._raw is not None]
    show(f"raw launchers found {len(ls)}", 0)
    out = torch.empty((1, 7168), dtype=torch.bfloat16, device=dev)
    for L in ls:
        if getattr(L.fn, "__name__", "") == "block_dequant_kernel" and L._tensors == 3 and L.fixed:
            show("Launcher call (block_dequant, preallocated)", timing.loop_us(lambda: L(q, s, out), N))
            a = (*L.grid, torch._C._cuda_getCurrentRawStream(0), *L._head, q.data_ptr(), s.data_ptr(), out.data_ptr(),
                 *L._rest)
            raw = L._raw
            show("C launcher, prebuilt arguments", timing.loop_us(lambda: raw(*a), N))
            break
