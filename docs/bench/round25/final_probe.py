"""Round-25 probe (H100): the shipped Gluon GEMM (`gluon_launch.config_for`'s configuration) on the six bench shapes,
per format (FP8, INT8) and PROBE_MS rows (default 4096,16384): the plain bf16 output, + a bf16 bias, re-quantized per
1×128, bias + re-quantized, and cuBLAS block-wise (FP8) or `torch._int_mm` (INT8, no scaling), timed interleaved
(quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed, median of 15).

Usage: PYTHONPATH=<tree>:docs/bench/round24 python3 docs/bench/round25/final_probe.py TAG >> out.jsonl (`--warm`:
compile every case and exit); `final_probe.py --table out.jsonl` prints each run's epilogues over the plain GEMM
and the plain GEMM over the vendor's, per shape and in geometric mean over the six.
"""
import json
import math
import os
import sys

EPIS = ("plain", "bias", "requant", "bias+requant")


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(rows[0]["device"], rows[0]["versions"])
    print("tag    fmt       M      N      K tile      plain us  bias   rq  b+rq  vendor/plain")
    groups = {}
    for r in rows:
        us = r["us"]
        ratios = [us[e] / us["plain"] for e in EPIS[1:]] + [r["vendor_us"] / us["plain"]]
        groups.setdefault((r["tag"], r["fmt"], r["M"]), []).append(ratios)
        print(f"{r['tag']:6} {r['fmt']:4} {r['M']:6} {r['N']:6} {r['K']:6} {r['tile']:9} {us['plain']:8.1f} "
              + " ".join(f"{x:5.3f}" for x in ratios))
    print("geomean over the six shapes: bias, re-quantized, bias + re-quantized over plain; vendor over plain")
    for (tag, fmt, M), rs in groups.items():
        g = [math.exp(sum(math.log(r[i]) for r in rs) / len(rs)) for i in range(4)]
        print(f"{tag:6} {fmt:4} {M:6} " + " ".join(f"{x:5.3f}" for x in g) + f"  (lowest vendor/plain "
              f"{min(r[3] for r in rs):.3f})")


def main():
    import torch

    from quantcore import capability
    from quantcore.backends.triton import gluon_launch as gll
    from quantcore.bench import baselines
    from quantcore.bench.shapes import DEEPSEEK_NK
    from quantcore.bench.timing import gpu_times_us
    from stagger_probe import EPILOGUES, FMTS, PROFILE, operands  # docs/bench/round24 on sys.path

    def launch(a, a_s, w, w_s, bias, epi):
        M, K = a.shape
        N = w.shape[0]
        cfg = gll.config_for(M, N, K, 128, 128 if epi.get("requant") else None)
        b = bias if epi.get("bias") else None
        run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=b, activation=None,
                                    out_dtype=torch.bfloat16, out_quant=a.dtype if epi.get("requant") else None,
                                    out_group=128, ue8m0_out=False, eps=1e-4, profile=PROFILE, config=cfg)
        return (lambda: run(a, a_s, w, w_s, b)), f"{cfg.block_m}x{cfg.block_n}"

    tag = sys.argv[1]
    for fname in os.environ.get("PROBE_FMTS", "fp8,int8").split(","):
        for M in [int(m) for m in os.environ.get("PROBE_MS", "4096,16384").split(",")]:
            for N, K in DEEPSEEK_NK:
                a, a_s, w, w_s, bias = operands(M, N, K, FMTS[fname])
                runs = [launch(a, a_s, w, w_s, bias, EPILOGUES[e]) for e in EPIS]
                fns = [r for r, _ in runs]
                if tag == "--warm":
                    for fn in fns:
                        fn()
                    continue
                fns.append(baselines.cublas_blockwise_fp8(a, a_s, w, w_s) if fname == "fp8" else baselines.int_mm(a, w))
                us = gpu_times_us(fns)
                print(json.dumps(dict(tag=tag, fmt=fname, M=M, N=N, K=K, tile=runs[0][1], us=dict(zip(EPIS, us)),
                                      vendor_us=us[-1], device=torch.cuda.get_device_name(),
                                      versions=capability.versions())), flush=True)
                del a, w
                torch.cuda.empty_cache()
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        main()
