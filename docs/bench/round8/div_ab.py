"""Round-8 probe (H100): GEMMs with a fused activation, and quantized GELU, with the activation's
divisions done by `tl.div_rn` (the tree before the change, OLD) and by `div_rn_normal` (this tree),
alternating between the two trees in fresh processes. GPU time (quantcore.bench.timing.gpu_time_us)
of each case, and its time over the plain GEMM's in the same process.

Run from the repository root: python3 docs/bench/round8/div_ab.py OLD_TREE [rounds]
(OLD_TREE: a directory holding the earlier `quantcore` package, e.g. from `git archive <rev> quantcore`.)
"""
import json
import sys

from ab import alternate

GEMMS = [("triton[gluon]", "fp8", 4096, 24576, 1536), ("triton[gluon]", "fp8", 4096, 4096, 7168),
         ("triton[gluon]", "int8", 4096, 7168, 2048), ("triton[gluon]", "fp8", 4096, 32768, 512),
         ("triton", "fp8", 4096, 7168, 2048), ("triton", "int8", 512, 4096, 7168), ("triton", "fp8", 16, 4096, 7168)]
ACTS = (None, "silu", "gelu", "gelu_tanh")


def measure():
    import torch

    from quantcore import ops
    from quantcore.bench.timing import gpu_time_us

    rows = []
    for backend, fmt, M, N, K in GEMMS:
        dtype = torch.float8_e4m3fn if fmt == "fp8" else torch.int8
        torch.manual_seed(0)
        a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), dtype=dtype)
        w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05, dtype=dtype)
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        for act in ACTS:
            kw = {} if act is None else dict(bias=bias, activation=act)
            rows.append(dict(case=f"{backend} {fmt} {M}x{N}x{K} {act or 'plain'}",
                             us=gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend=backend, **kw))))
    for fmt in ("fp8", "int8"):
        dtype = torch.float8_e4m3fn if fmt == "fp8" else torch.int8
        q, s = ops.act_quant(torch.randn(16384, 7168, device="cuda", dtype=torch.bfloat16), dtype=dtype)
        rows.append(dict(case=f"quantized_gelu triton {fmt} 16384x7168",
                         us=gpu_time_us(lambda: ops.quantized_gelu(q, s, backend="triton"))))
    print(json.dumps(rows))


if __name__ == "__main__" and sys.argv[1] == "--measure":
    measure()
elif __name__ == "__main__":
    results = alternate(__file__, sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    print(f"{'case':48s} | µs old (each round) | µs new | old / new | over plain: old, new")
    plain = {}
    for i, row in enumerate(results["old"][0]):
        o = min(run[i]["us"] for run in results["old"])
        n = min(run[i]["us"] for run in results["new"])
        if row["case"].endswith("plain"):
            plain[row["case"][:-6]] = (o, n)
        base = plain.get(row["case"].rsplit(" ", 1)[0])
        over = f"{o / base[0]:.2f}, {n / base[1]:.2f}" if base and not row["case"].endswith("plain") else ""
        each = {label: " ".join(f"{run[i]['us']:8.1f}" for run in runs) for label, runs in results.items()}
        print(f"{row['case']:48s} | {each['old']} | {each['new']} | {o / n:5.2f} | {over}")
