"""Device probe 1: launch micro-costs (tensor vs int pointers), allocation, layer host-issue time."""
import os, statistics, subprocess, sys, time
import torch
import quantcore, quantcore.nn as qnn
from quantcore.backends.triton import direct

dev = torch.device("cuda")
out_dir = os.environ.get("OUT", "/tmp")


def issue_us(fn, n=200, rounds=15):
    """Host issue time per call: n calls after a synchronize, no sync in the loop; median of rounds."""
    res = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        res.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(res), min(res)


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


print("== micro (host issue time per call, us: median / min)", flush=True)
with torch.inference_mode():
    lin = torch.nn.Linear(512, 32768, bias=True, device=dev, dtype=torch.bfloat16)
    layer = qnn.QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)
    x = torch.randn(1, 1, 512, device=dev, dtype=torch.bfloat16)
    layer(x)
    layer(x)
    (real,) = launchers(layer._site._plan.launch)
    captured = []
    orig = direct.Launcher.__call__
    direct.Launcher.__call__ = lambda self, *a: (captured.append(a), orig(self, *a))[1]
    layer(x)
    direct.Launcher.__call__ = orig
    args = captured[0]
    one = direct.Launcher(real.fn, (1, 1, 1), real.constants, dev)
    one(*args)
    one(*args)
    print("   raw launcher:", one.raw, "split", real.constants["SPLIT_K"], flush=True)
    ints = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    npt = sum(isinstance(a, torch.Tensor) for a in args)
    conv = lambda: one(*(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))
    tens = [a for a in args if isinstance(a, torch.Tensor)]
    rest = args[len(tens):]
    dp = lambda: one(*[t.data_ptr() for t in tens], *rest)
    out = torch.empty(1, 32768, device=dev, dtype=torch.bfloat16)
    for name, fn in (("launch, tensor pointers (%d)" % npt, lambda: one(*args)),
                     ("launch, int pointers", lambda: one(*ints)),
                     ("launch, ints from data_ptr() per call", dp),
                     ("torch.empty((1, 32768), dtype, device)", lambda: torch.empty((1, 32768), dtype=torch.bfloat16, device=dev)),
                     ("torch.empty((1,1,32768), dtype, device)", lambda: torch.empty((1, 1, 32768), dtype=torch.bfloat16, device=dev)),
                     ("x.new_empty((1, 32768))", lambda: x.new_empty((1, 32768))),
                     ("torch.empty_like(out)", lambda: torch.empty_like(out)),
                     ("getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0)),
                     ("out.reshape(1, 1, 32768)", lambda: out.reshape(1, 1, 32768)),
                     ("out.view(1, 1, 32768)", lambda: out.view(1, 1, 32768)),
                     ("x.device", lambda: x.device),
                     ("x.data_ptr()", lambda: x.data_ptr()),
                     ("QuantLinear 1x512->32768 (this tree)", lambda: layer(x)),
                     ("nn.Linear 1x512->32768", lambda: lin(x)),
                     ):
        med, mn = issue_us(fn)
        print(f"   {name:42s} {med:6.2f} / {mn:6.2f}", flush=True)

print("== layer host issue time: this tree vs HEAD before (subprocesses alternating)", flush=True)
