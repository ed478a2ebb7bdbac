"""Device probe 6: is an eager QuantLinear loop host- or GPU-bound? Submit time (no sync) vs synced loop."""
import os, time
import torch
from quantcore.nn import QuantLinear
OUT = os.environ.get("OUT", "/tmp")
log = open(f"{OUT}/probe6.txt", "w")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()
def loops(fn, n=300):
    for _ in range(30): fn()
    torch.cuda.synchronize()
    best_submit = best_total = 1e9
    for _ in range(5):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(n): fn()
        t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        best_submit, best_total = min(best_submit, (t1 - t0) / n * 1e6), min(best_total, (t2 - t0) / n * 1e6)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return best_submit, best_total, s.elapsed_time(e) * 1e3 / n
with torch.inference_mode():
    for dim in (512, 4096):
        for batch in (1, 8):
            x = torch.randn(batch, 1, dim, device="cuda", dtype=torch.bfloat16)
            lin = torch.nn.Linear(dim, dim, bias=False, device="cuda", dtype=torch.bfloat16)
            ql = QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)
            for name, m in (("nn.Linear bf16", lin), ("QuantLinear fp8", ql)):
                sub, tot, ev = loops(lambda: m(x))
                say(f"dim {dim:<5} batch {batch} {name:<16} submit {sub:6.1f} us/call  loop+sync {tot:6.1f}  events {ev:6.1f}")
