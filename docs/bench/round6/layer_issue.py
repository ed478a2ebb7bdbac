"""Host issue time of a QuantLinear call and nn.Linear at decode shapes (PYTHONPATH picks quantcore)."""
import statistics, sys, time
import torch
import quantcore.nn as qnn
dev = torch.device("cuda")
tag = sys.argv[1]


def issue_us(fn, n=100, rounds=31):
    res = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        res.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(res)


with torch.inference_mode():
    row = []
    for (k, n, bias, b) in ((4096, 4096, False, 1), (4096, 16384, True, 1), (16384, 4096, True, 8)):
        lin = torch.nn.Linear(k, n, bias=bias, device=dev, dtype=torch.bfloat16)
        x = torch.randn(b, 1, k, device=dev, dtype=torch.bfloat16)
        f8 = qnn.QuantLinear.from_linear(lin, dtype=torch.float8_e4m3fn)
        i8 = qnn.QuantLinear.from_linear(lin, dtype=torch.int8)
        for m in (lin, f8, i8):
            for _ in range(20):
                m(x)
        t = {name: [] for name in ("bf16", "fp8", "int8")}
        for _ in range(3):
            for name, m in (("bf16", lin), ("fp8", f8), ("int8", i8)):
                t[name].append(issue_us(lambda: m(x)))
        row.append(f"B={b} {k}->{n}: " + " ".join(f"{nm} {statistics.median(v):5.1f}" for nm, v in t.items()))
    print(f"   {tag:5s} " + " | ".join(row), flush=True)
