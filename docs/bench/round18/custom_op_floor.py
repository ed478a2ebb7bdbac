"""What `torch.ops` costs by itself: a custom op with quantcore's scaled_mm / act_quant / quant_linear schema
whose Autograd kernel returns a preallocated tensor at once (the dispatcher's boxing into Python and back,
nothing else), beside the same quantcore custom op and `quantcore.ops` call, back to back (`timing.loop_us`
of 2000 calls), ROUNDS rounds; JSON lines tagged with argv[1]."""
import json, statistics, sys
import torch
import quantcore  # noqa: F401  (registers torch.ops.quantcore)
from quantcore import ops
from quantcore.bench import timing

tag, ROUNDS, N = sys.argv[1], 3, 2000
dev = "cuda"
lib = torch.library.Library("qcfloor", "DEF")
x1k = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
qs, ss = ops.act_quant(x1k)
ws_, wss = ops.weight_quant(torch.randn(512, 1024, device=dev, dtype=torch.bfloat16))
x7 = torch.randn(1, 7168, device=dev, dtype=torch.bfloat16)
ready = torch.empty(1, 512, device=dev, dtype=torch.bfloat16)
pair = (torch.empty(1, 7168, device=dev, dtype=torch.float8_e4m3fn), torch.empty(1, 56, device=dev))
for name, out in (("scaled_mm", ready), ("act_quant", pair), ("quant_linear", ready)):
    schema = str(getattr(torch.ops.quantcore, name).default._schema).split("::", 1)[1]
    lib.define(schema)
    returned = lambda *a, out=out, **k: out  # noqa: E731
    lib.impl(name, returned, "CompositeExplicitAutograd")
    lib.impl(name, returned, "Autograd")
qf, qc = torch.ops.qcfloor, torch.ops.quantcore
cases = {
    "floor scaled_mm": lambda: qf.scaled_mm(qs, ss, ws_, wss, None),
    "floor act_quant": lambda: qf.act_quant(x7),
    "floor quant_linear": lambda: qf.quant_linear(x1k, ws_, wss, None),
}
for be in ("triton", "cupy"):
    cases.update({
        f"{be} custom op scaled_mm 1x512x1024": lambda be=be: qc.scaled_mm(qs, ss, ws_, wss, None, backend=be),
        f"{be} custom op act_quant 1x7168": lambda be=be: qc.act_quant(x7, backend=be),
        f"{be} custom op quant_linear 1x512x1024": lambda be=be: qc.quant_linear(x1k, ws_, wss, None, backend=be),
        f"{be} ops scaled_mm 1x512x1024": lambda be=be: ops.scaled_mm(qs, ss, ws_, wss, backend=be),
    })
for fn in cases.values():
    fn(); fn()
res = {k: [] for k in cases}
for r in range(ROUNDS):
    names = list(cases)
    for name in names[r % len(names):] + names[:r % len(names)]:
        res[name].append(timing.loop_us(cases[name], N))
for name, v in res.items():
    print(json.dumps({"tag": tag, "case": name, "median_us": round(statistics.median(v), 2),
                      "min_us": round(min(v), 2)}))
