"""Where a natively replayed call's host time goes, at 1 row (act_quant 1x7168 FP8, Triton and CuPy): back to
back (`timing.loop_us` of 4000 calls), ROUNDS rounds rotating, min and median per part. Replays made from the
kept plan's own description with parts removed: no launch (the outputs' allocation and wrapping), no
outputs (the launch alone, into preallocated outputs), neither (the call into C++, its guard and stream)."""
import json, statistics, sys
import torch
import quantcore
from quantcore import dispatch, ops, opdef
from quantcore.backends import native
from quantcore.bench import timing

ROUNDS, N = 5, 4000
ext = native.module()
assert ext is not None, native.reason()
x = torch.randn(1, 7168, device="cuda", dtype=torch.bfloat16)
qc = torch.ops.quantcore
lib = torch.library.Library("qcfloor", "DEF")
pair = (torch.empty(1, 7168, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, 56, device="cuda"))
lib.define(str(qc.act_quant.default._schema).split("::", 1)[1])
lib.impl("act_quant", lambda *a, **k: pair, "CompositeExplicitAutograd")
lib.impl("act_quant", lambda *a, **k: pair, "Autograd")
definition = opdef.get("act_quant")
cases = {"torch.ops floor (Python kernel returning at once)": lambda: torch.ops.qcfloor.act_quant(x),
         "torch.empty_like x": lambda: torch.empty_like(x)}
for be in ("triton", "cupy"):
    for _ in range(3):
        ops.act_quant(x, backend=be)
    plan = dispatch.kept("act_quant", (x,), {}, be)
    replay = plan.launch
    assert type(replay).__name__ == "Replay" and replay.ready
    count, (outs, launches, results, as_tuple), capture = replay.run.native()
    out = [torch.empty_strided(s, st, dtype=d, device="cuda") for s, st, d in outs]
    fixed = [(l[:4] + ([(0, out[v].data_ptr()) if k == 2 else (k, v) for k, v in l[4]],)) for l in launches]
    parts = {
        "no launch": ext.Replay(lambda *a: None, lambda: (count, (outs, [], results, as_tuple), False), 0),
        "no outputs": ext.Replay(lambda *a: None, lambda: (count, ([], fixed, [], False), False), 0),
        "neither": ext.Replay(lambda *a: None, lambda: (count, ([], [], [], False), False), 0),
    }
    for p in parts.values():
        p(x)
        assert p.ready
    cases.update({f"{be} ops.act_quant": lambda be=be: ops.act_quant(x, backend=be),
                  f"{be} torch.ops act_quant": lambda be=be: qc.act_quant(x, backend=be),
                  f"{be} plan's replay": lambda r=replay: r(x),
                  **{f"{be} replay, {k}": (lambda p=p: p(x)) for k, p in parts.items()}})
cases["plan key (Python)"] = lambda d=definition.defaults: definition.key(x, **d, backend="triton")
for f in cases.values():
    f(); f()
res = {k: [] for k in cases}
for r in range(ROUNDS):
    names = list(cases)
    for name in names[r % len(names):] + names[:r % len(names)]:
        res[name].append(timing.loop_us(cases[name], N))
for name, v in res.items():
    print(json.dumps({"case": name, "median_us": round(statistics.median(v), 2), "min_us": round(min(v), 2)}))
