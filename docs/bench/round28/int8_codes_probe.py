"""Round-28 probe (H100): the Gluon GEMM's re-quantized epilogue, in the tree on PYTHONPATH, so that two trees run
alternately on one machine (`int8_codes.sh`) give a before/after of the INT8 codes' route (`quant.int8_encode`).

Per format (PROBE_FMTS, default int8,fp8: FP8's epilogue is untouched, a control), PROBE_MS rows (default
4096,16384) and the six bench shapes: config_for's configuration with a bf16 output, re-quantized per 1×128 and
bias + re-quantized, timed interleaved (quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed, median of 15),
with a checksum of each re-quantized output's bits (codes, then scales), which the two trees must share.

Usage: PYTHONPATH=<tree>:docs/bench/round24 python3 docs/bench/round28/int8_codes_probe.py TAG >> out.jsonl;
`--warm I N` compiles every N-th case from the I-th; `--table out.jsonl` prints, per case, each tag's median times
over the plain GEMM and whether the bits agree, and the geometric means over the six shapes.
"""
import json
import math
import os
import statistics
import sys

EPIS = ("plain", "requant", "bias+requant")


def cases():
    from quantcore.bench.shapes import DEEPSEEK_NK
    for fname in os.environ.get("PROBE_FMTS", "int8,fp8").split(","):
        for M in [int(m) for m in os.environ.get("PROBE_MS", "4096,16384").split(",")]:
            for N, K in DEEPSEEK_NK:
                yield fname, M, N, K


def main():
    import torch

    from quantcore import capability
    from quantcore.backends.triton import gluon_launch as gll
    from quantcore.bench.timing import gpu_times_us
    from stagger_probe import EPILOGUES, FMTS, PROFILE, checksum, operands  # docs/bench/round24 on sys.path

    def launch(a, a_s, w, w_s, bias, epi):
        M, K = a.shape
        cfg = gll.config_for(M, w.shape[0], K, 128, 128 if epi.get("requant") else None)
        b = bias if epi.get("bias") else None
        run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=b, activation=None,
                                    out_dtype=torch.bfloat16, out_quant=a.dtype if epi.get("requant") else None,
                                    out_group=128, ue8m0_out=False, eps=1e-4, profile=PROFILE, config=cfg)
        return (lambda: run(a, a_s, w, w_s, b)), f"{cfg.block_m}x{cfg.block_n}"

    warm = sys.argv[1] == "--warm"
    todo = list(cases())
    if warm:
        todo = todo[int(sys.argv[2])::int(sys.argv[3])]
    for fname, M, N, K in todo:
        ops_ = operands(M, N, K, FMTS[fname])
        runs = [launch(*ops_, EPILOGUES[e]) for e in EPIS]
        fns = [r for r, _ in runs]
        if warm:
            for fn in fns:
                fn()
            continue
        us = gpu_times_us(fns)
        print(json.dumps(dict(tag=sys.argv[1], fmt=fname, M=M, N=N, K=K, tile=runs[0][1], us=dict(zip(EPIS, us)),
                              sums={e: checksum(f()) for e, f in zip(EPIS[1:], fns[1:])},
                              device=torch.cuda.get_device_name(), versions=capability.versions())), flush=True)
        del ops_, runs, fns
        torch.cuda.empty_cache()
    torch.cuda.synchronize()


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    tags = list(dict.fromkeys(r["tag"] for r in rows))
    print(rows[0]["device"], rows[0]["versions"])
    print("time over the plain GEMM, median over each tag's processes: " + ", ".join(tags))
    print("fmt       M      N      K  plain us " + "  ".join(f"{t + ' rq':>10} {t + ' b+rq':>10}" for t in tags)
          + "  same bits")
    cells = {}
    for key in dict.fromkeys((r["fmt"], r["M"], r["N"], r["K"]) for r in rows):
        mine = [r for r in rows if (r["fmt"], r["M"], r["N"], r["K"]) == key]
        ratio = {(t, e): statistics.median(r["us"][e] / r["us"]["plain"] for r in mine if r["tag"] == t)
                 for t in tags for e in EPIS[1:]}
        cells[key] = ratio
        same = all(len({json.dumps(r["sums"][e]) for r in mine}) == 1 for e in EPIS[1:])
        plain = statistics.median(r["us"]["plain"] for r in mine)
        print(f"{key[0]:4} {key[1]:6} {key[2]:6} {key[3]:6} {plain:9.1f} "
              + "  ".join(f"{ratio[t, 'requant']:10.3f} {ratio[t, 'bias+requant']:10.3f}" for t in tags)
              + f"  {'yes' if same else 'NO'}")
    print("geometric mean over the six shapes")
    for fm in dict.fromkeys((k[0], k[1]) for k in cells):
        mine = [v for k, v in cells.items() if (k[0], k[1]) == fm]
        g = {c: math.exp(sum(math.log(v[c]) for v in mine) / len(mine)) for c in mine[0]}
        print(f"{fm[0]:4} {fm[1]:6} " + "  ".join(f"{t}: rq {g[t, 'requant']:.3f} b+rq {g[t, 'bias+requant']:.3f}"
                                                for t in tags))


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        main()
