"""CPU host probe: the Python cost of an eager QuantLinear call down to the C launcher (replaced by a
no-op), on the real Triton plan built under the interpreter."""
import os, sys, time
os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
torch._C._cuda_getCurrentRawStream = lambda d: 0
import quantcore
from quantcore import dispatch
from quantcore.backends.triton import direct
from quantcore.nn import QuantLinear


def t(fn, n=20000):
    best = 1e9
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def launchers(obj, seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, direct.Launcher):
        return [obj]
    out = []
    for c in getattr(obj, "__closure__", None) or ():
        try:
            out += launchers(c.cell_contents, seen)
        except ValueError:
            pass
    return out


def noop(*a):
    return None


K, N = 256, 192
lin = torch.nn.Linear(K, N).to(torch.bfloat16).requires_grad_(False)
layer = QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)
x = torch.randn(1, 1, K, dtype=torch.bfloat16)
with quantcore.priority("triton"), torch.inference_mode():
    y0 = layer(x)
    plan = layer._site._plan
    ls = launchers(plan.launch)
    assert ls, "no launcher"
    for l in ls:
        l._raw, l._head, l._tail, l._tensors = noop, (), (), 7
    print("launchers", len(ls), "impl", plan.launch)
    ident = torch.nn.Identity()
    for name, fn in (("QuantLinear call, no-op launch", lambda: layer(x)),
                     ("dispatch._state()", dispatch._state),
                     ("torch.empty((1, N))", lambda: torch.empty((1, N), dtype=torch.bfloat16, device=x.device)),
                     ("nn.Identity call", lambda: ident(x))):
        print(f"{name:36s} {t(fn):6.2f} us", flush=True)
    if len(sys.argv) > 1:
        import cProfile, pstats
        cProfile.run("for _ in range(20000): layer(x)", "/tmp/prof")
        pstats.Stats("/tmp/prof").sort_stats("tottime").print_stats(25)
