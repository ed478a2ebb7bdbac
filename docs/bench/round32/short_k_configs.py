"""Round-32 probe (H100): the Gluon GEMM's re-quantized epilogues (per 1×128, with and without a bf16 bias) at the
bench shapes of K <= 2048 under configurations around config_for's, timed interleaved with each other and with the
plain GEMM of config_for's configuration (quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed, median of
15), with a checksum of each output's bits, which every configuration must share.

Usage: python3 short_k_configs.py TAG >> out.jsonl (PROBE_MS rows, default 4096); `--warm I N` launches (so compiles)
every N-th (case, epilogue, configuration) from the I-th; `--table out.jsonl` prints each configuration's time over the plain GEMM per case, the median
over processes, and the geometric means over the shapes.
"""
import dataclasses
import json
import math
import os
import statistics
import sys
from pathlib import Path

SHAPES = [(24576, 1536), (32768, 512), (7168, 2048)]
# Each a change to config_for's configuration (GluonConfig fields).
VARIANTS = {"config_for": {}, "group_m=8": {"group_m": 8}, "group_m=16": {"group_m": 16}, "stages=3": {"stages": 3},
            "producer_regs=40": {"producer_regs": 40}, "stagger=off": {"stagger": False},
            "128x128": {"block_n": 128, "sub_n": None, "producer_regs": None}}
EPIS = {"requant": False, "bias+requant": True}


def cases():
    for fname in ("fp8", "int8"):
        for M in [int(m) for m in os.environ.get("PROBE_MS", "4096").split(",")]:
            for N, K in SHAPES:
                yield fname, M, N, K


def main():
    import torch

    from quantcore import capability
    from quantcore.backends.triton import gluon_launch as gll
    from quantcore.bench.timing import gpu_times_us
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round24"))
    from stagger_probe import FMTS, PROFILE, checksum, operands

    def launch(a, a_s, w, w_s, bias, requant, with_bias, change):
        M, K = a.shape
        cfg = dataclasses.replace(gll.config_for(M, w.shape[0], K, 128, 128 if requant else None), **change)
        b = bias if with_bias else None
        run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=b, activation=None,
                                    out_dtype=torch.bfloat16, out_quant=a.dtype if requant else None, out_group=128,
                                    ue8m0_out=False, eps=1e-4, profile=PROFILE, config=cfg)
        return lambda: run(a, a_s, w, w_s, b)

    if sys.argv[1] == "--warm":  # one launch of every N-th (case, epilogue, variant) from the I-th
        jobs = [(c, e, v) for c in cases() for e in EPIS for v in ("plain", *VARIANTS)]
        for (fname, M, N, K), epi, v in jobs[int(sys.argv[2])::int(sys.argv[3])]:
            ops_ = operands(M, N, K, FMTS[fname])
            if v == "plain":
                launch(*ops_, False, False, {})()
            else:
                launch(*ops_, True, EPIS[epi], VARIANTS[v])()
        torch.cuda.synchronize()
        return
    for fname, M, N, K in cases():
        ops_ = operands(M, N, K, FMTS[fname])
        plain = launch(*ops_, False, False, {})
        for epi, with_bias in EPIS.items():
            fns = [launch(*ops_, True, with_bias, change) for change in VARIANTS.values()]
            us = gpu_times_us([plain] + fns)
            sums = {checksum(fn()) for fn in fns}
            print(json.dumps(dict(tag=sys.argv[1], fmt=fname, M=M, N=N, K=K, epilogue=epi, plain_us=us[0],
                                  us=dict(zip(VARIANTS, us[1:])), same_bits=len(sums) == 1,
                                  device=torch.cuda.get_device_name(), versions=capability.versions())), flush=True)
        del ops_
        torch.cuda.empty_cache()
    torch.cuda.synchronize()


def table(path):
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    print(rows[0]["device"], rows[0]["versions"])
    print("time over the plain GEMM (config_for's), median over processes")
    print(f"{'fmt':4} {'M':>6} {'N':>6} {'K':>5} {'epilogue':13}" + "".join(f"{v:>17}" for v in VARIANTS) + "  same bits")
    ratios = {}
    for key in dict.fromkeys((r["fmt"], r["M"], r["N"], r["K"], r["epilogue"]) for r in rows):
        mine = [r for r in rows if (r["fmt"], r["M"], r["N"], r["K"], r["epilogue"]) == key]
        ratios[key] = {v: statistics.median(r["us"][v] / r["plain_us"] for r in mine) for v in VARIANTS}
        print(f"{key[0]:4} {key[1]:6} {key[2]:6} {key[3]:5} {key[4]:13}"
              + "".join(f"{ratios[key][v]:17.3f}" for v in VARIANTS)
              + f"  {'yes' if all(r['same_bits'] for r in mine) else 'NO'}")
    print("geometric mean over the shapes")
    for fme in dict.fromkeys((k[0], k[1], k[4]) for k in ratios):
        mine = [v for k, v in ratios.items() if (k[0], k[1], k[4]) == fme]
        print(f"{fme[0]:4} {fme[1]:6} {fme[2]:13}" + "".join(
            f"{math.exp(sum(math.log(m[v]) for m in mine) / len(mine)):17.3f}" for v in VARIANTS))


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        main()
