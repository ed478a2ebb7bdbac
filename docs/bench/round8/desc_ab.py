"""Round-8 probe (H100): eager time per call of GEMMs whose kernels take TMA descriptors, with the
descriptors made and encoded per call (the tree before the change, OLD) and kept per address by the
launcher (this tree), alternating between the two trees in fresh processes; beside each, torch's bf16
linear of the same shape.

Run from the repository root: python3 docs/bench/round8/desc_ab.py OLD_TREE [rounds]
(OLD_TREE: a directory holding the earlier `quantcore` package, e.g. from `git archive <rev> quantcore`.)
Eager: quantcore.bench.timing.eager_time_us (back to back, one synchronize); GPU: gpu_time_us.
"""
import json
import sys

from ab import alternate

CASES = [("scaled_mm", "triton[gluon]", "fp8", 128, 7168, 2048), ("scaled_mm", "triton[gluon]", "fp8", 128, 4096, 7168),
         ("scaled_mm", "triton[gluon]", "int8", 512, 7168, 2048), ("scaled_mm", "triton", "fp8", 4096, 4096, 7168),
         ("quant_linear", None, "fp8", 128, 4096, 4096), ("quant_linear", None, "int8", 512, 4096, 4096),
         ("QuantLinear", None, "fp8", 128, 4096, 4096)]


def measure():
    import torch

    from quantcore import ops
    from quantcore.bench.timing import eager_time_us, gpu_time_us
    from quantcore.nn import QuantLinear

    rows = []
    for op, backend, fmt, M, N, K in CASES:
        dtype = torch.float8_e4m3fn if fmt == "fp8" else torch.int8
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        wb = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05
        w, w_s = ops.weight_quant(wb, dtype=dtype)
        a, a_s = ops.act_quant(x, dtype=dtype)
        if op == "scaled_mm":
            call = lambda: ops.scaled_mm(a, a_s, w, w_s, backend=backend)
        elif op == "quant_linear":
            call = lambda: ops.quant_linear(x, w, w_s)
        else:
            lin = torch.nn.Linear(K, N, bias=True, device="cuda", dtype=torch.bfloat16)
            layer = QuantLinear.from_linear(lin, dtype=dtype)
            call = lambda: layer(x)
        bf16 = lambda: torch.nn.functional.linear(x, wb)
        call()
        rows.append(dict(case=f"{op} {backend or 'auto'} {fmt} {M}x{N}x{K}", eager=eager_time_us(call),
                         gpu=gpu_time_us(call), bf16_eager=eager_time_us(bf16)))
    print(json.dumps(rows))


if __name__ == "__main__" and sys.argv[1] == "--measure":
    measure()
elif __name__ == "__main__":
    results = alternate(__file__, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    print(f"{'case':48s} | eager µs old (each round) | eager µs new | GPU µs old / new | bf16 eager µs")
    for i, case in enumerate(CASES):
        o = [run[i] for run in results["old"]]
        n = [run[i] for run in results["new"]]
        fmt = lambda rs, key: " ".join(f"{r[key]:6.1f}" for r in rs)
        print(f"{o[0]['case']:48s} | {fmt(o, 'eager')} | {fmt(n, 'eager')} | {o[0]['gpu']:.1f} / {n[0]['gpu']:.1f} | "
              f"{fmt(o + n, 'bf16_eager')}")
