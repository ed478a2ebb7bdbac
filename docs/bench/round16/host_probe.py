"""Eager time per call of `quantcore.ops` calls at 1 row on the H100 host (back to back, `timing.loop_us` of
2000 calls, five interleaved rounds, median and min), the kept plans' replay form, and a cProfile of 5000
calls of dequant_bias and act_dequant. The "fp32 bias" case casts its bias inside the timed lambda (one more
kernel a call). Output: host_probe.txt (the tool's printed output, copied)."""
import cProfile, pstats, time, torch, statistics
from quantcore import ops, dispatch
from quantcore.bench import timing
torch.manual_seed(0)
dev = "cuda"
n = 2560
g = torch.randn(1, n, device=dev).to(torch.bfloat16)
sa, sb, bias = torch.rand(1, device=dev), torch.rand(n, device=dev), torch.randn(n, device=dev).to(torch.bfloat16)
q, s = ops.act_quant(torch.randn(1, 7168, device=dev, dtype=torch.bfloat16))
calls = {
    "dequant_bias bf16 bias": lambda: ops.dequant_bias(g, sa, sb, bias),
    "dequant_bias no bias": lambda: ops.dequant_bias(g, sa, sb),
    "dequant_bias fp32 bias": lambda: ops.dequant_bias(g, sa, sb, bias.float()),
    "act_dequant": lambda: ops.act_dequant(q, s),
    "act_quant": lambda: ops.act_quant(g),
}
bf = torch.float32
for name, fn in calls.items():
    fn(); fn()
res = {k: [] for k in calls}
for _ in range(5):
    for name, fn in calls.items():
        res[name].append(timing.loop_us(fn, 2000))
for name, v in res.items():
    print(f"{name:26s} {statistics.median(v):6.2f} us (min {min(v):.2f})")
for key, plan in dispatch._plans.items():
    if key[0] in ("dequant_bias", "act_dequant"):
        print(key[0], "direct", plan.direct, "bindings", plan.bindings is not None, "finish", getattr(plan.finish, "__name__", plan.finish))
for name in ("dequant_bias bf16 bias", "act_dequant"):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(5000): calls[name]()
    pr.disable(); print("====", name); pstats.Stats(pr).sort_stats("tottime").print_stats(10)
