"""Eager time per call at 1 row, back to back (`timing.loop_us` of 2000 calls), ROUNDS rounds with the cases'
order rotating, median and min per case: every op through `quantcore.ops` and `torch.ops.quantcore` for the
Triton and CuPy backends, torch's bf16 F.linear, and a custom op that returns at once (`torch.ops`' own
floor, round 18's custom_op_floor.py). JSON lines tagged with argv[1]; QUANTCORE_NATIVE (set by
host_probe.sh) says whether kept plans are replayed natively. With argv[2] == "gpu", each case's GPU time."""
import json, statistics, sys
import torch
import quantcore  # noqa: F401  (registers torch.ops.quantcore)
from quantcore import ops
from quantcore.backends import native
from quantcore.bench import timing

tag, ROUNDS, N = sys.argv[1], 3, 2000
dev = "cuda"
torch.manual_seed(0)
x7 = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
q, s = ops.act_quant(x7)
qi, si = ops.act_quant(x7, dtype=torch.int8)
g = torch.randn(1, 2560, device=dev).to(torch.bfloat16)
sa, sb, bias = torch.rand(1, device=dev), torch.rand(2560, device=dev), torch.randn(2560, device=dev).to(torch.bfloat16)
w, ws = ops.weight_quant(torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16))
wi, wsi = ops.weight_quant(torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16), dtype=torch.int8)
w512 = torch.randn(512, 1024, device=dev, dtype=torch.bfloat16)
x4 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
w4, ws4 = ops.weight_quant(torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16))
x1k = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
qs, ss = ops.act_quant(x1k)
ws_, wss = ops.weight_quant(w512)
bias512 = torch.randn(512, device=dev).to(torch.bfloat16)
qc = torch.ops.quantcore  # grad mode on, no input requiring grad
cases = {}
for be in ("triton", "cupy"):
    cases.update({
        f"{be} act_quant fp8": lambda be=be: ops.act_quant(x7, backend=be),
        f"{be} act_quant int8": lambda be=be: ops.act_quant(x7, dtype=torch.int8, backend=be),
        f"{be} act_dequant": lambda be=be: ops.act_dequant(q, s, backend=be),
        f"{be} weight_quant 512x1024": lambda be=be: ops.weight_quant(w512, backend=be),
        f"{be} weight_dequant 512x1024": lambda be=be: ops.weight_dequant(ws_, wss, backend=be),
        f"{be} quantized_gelu": lambda be=be: ops.quantized_gelu(q, s, backend=be),
        f"{be} dequant_bias bias": lambda be=be: ops.dequant_bias(g, sa, sb, bias, backend=be),
        f"{be} scaled_mm fp8 1x2112x7168": lambda be=be: ops.scaled_mm(q, s, w, ws, backend=be),
        f"{be} scaled_mm int8 1x2112x7168": lambda be=be: ops.scaled_mm(qi, si, wi, wsi, backend=be),
        f"{be} scaled_mm fp8 1x512x1024": lambda be=be: ops.scaled_mm(qs, ss, ws_, wss, backend=be),
        f"{be} scaled_mm fp8 1x512x1024 bias": lambda be=be: ops.scaled_mm(qs, ss, ws_, wss, bias=bias512, backend=be),
        f"{be} scaled_mm fp8 1x512x1024 requant": lambda be=be: ops.scaled_mm(qs, ss, ws_, wss,
                                                                             out_quant=torch.float8_e4m3fn, backend=be),
        f"{be} quant_linear fp8 1x4096x4096": lambda be=be: ops.quant_linear(x4, w4, ws4, backend=be),
        f"{be} quant_linear fp8 1x512x1024": lambda be=be: ops.quant_linear(x1k, ws_, wss, backend=be),
        f"{be} quant_linear fp8 1x512x1024 bias": lambda be=be: ops.quant_linear(x1k, ws_, wss, bias512, backend=be),
        f"{be} custom op act_quant fp8": lambda be=be: qc.act_quant(x7, backend=be),
        f"{be} custom op act_dequant": lambda be=be: qc.act_dequant(q, s, backend=be),
        f"{be} custom op scaled_mm fp8 1x512x1024": lambda be=be: qc.scaled_mm(qs, ss, ws_, wss, None, backend=be),
        f"{be} custom op quant_linear fp8 1x512x1024": lambda be=be: qc.quant_linear(x1k, ws_, wss, None, backend=be),
        f"{be} custom op quant_linear fp8 1x4096x4096": lambda be=be: qc.quant_linear(x4, w4, ws4, None, backend=be),
    })
cases["auto custom op act_quant fp8"] = lambda: qc.act_quant(x7)
cases["auto custom op quant_linear fp8 1x512x1024"] = lambda: qc.quant_linear(x1k, ws_, wss, None)
cases["auto ops quant_linear fp8 1x512x1024"] = lambda: ops.quant_linear(x1k, ws_, wss)
lib = torch.library.Library("qcfloor", "DEF")
pair = (torch.empty(1, 7168, device=dev, dtype=torch.float8_e4m3fn), torch.empty(1, 56, device=dev))
schema = str(qc.act_quant.default._schema).split("::", 1)[1]
lib.define(schema)
lib.impl("act_quant", lambda *a, **k: pair, "CompositeExplicitAutograd")
lib.impl("act_quant", lambda *a, **k: pair, "Autograd")
cases["floor custom op act_quant (returns at once)"] = lambda: torch.ops.qcfloor.act_quant(x7)
cases["torch F.linear bf16 1x4096x4096"] = lambda wb=torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16): \
    torch.nn.functional.linear(x4, wb)
for fn in cases.values():
    fn(); fn(); fn()
res = {k: [] for k in cases}
for r in range(ROUNDS):
    names = list(cases)
    for name in names[r % len(names):] + names[:r % len(names)]:
        res[name].append(timing.loop_us(cases[name], N))
gpu = dict(zip(cases, timing.gpu_times_us(list(cases.values())))) if sys.argv[2:] == ["gpu"] else {}
print(json.dumps({"tag": tag, "native": native.reason() or "in use"}))
for name, v in res.items():
    print(json.dumps({"tag": tag, "case": name, "median_us": round(statistics.median(v), 2), "min_us": round(min(v), 2),
                      **({"gpu_us": round(gpu[name], 2)} if name in gpu else {})}))
