"""Round-24 probe (H100): a re-quantized output per 1×128 where N is not a multiple of 256 but is of 192 (N = 2112:
16.5 groups). The plain GEMM takes 128×192 there, which cannot hold whole groups, so config_for gives the
re-quantized output the default 128×128 tile; 128×256 in 64-column sub-tiles holds them but leaves its last column
tile three-quarters empty. Per format and PROBE_MS rows (default 4096,8192,12288,16384), N = 2112, PROBE_KS (default
7168,2048): the plain GEMM on config_for's tile, the re-quantized output on 128×128 and on 128×256 (group_m as
config_for would give it), timed interleaved (gpu_times_us: CUDA events, L2 flushed, median of 15), with a check
that both re-quantized outputs agree bit for bit.

pad_tile.txt ran against the interim tree of lead_kb.diff (every kernel here unstaggered there too).

Usage: PYTHONPATH=<tree>:docs/bench/round24 python3 docs/bench/round24/pad_tile_probe.py >> out.jsonl;
`pad_tile_probe.py --table out.jsonl` prints the table.
"""
import dataclasses
import json
import os
import sys

MS = [int(m) for m in os.environ.get("PROBE_MS", "4096,8192,12288,16384").split(",")]
KS = [int(k) for k in os.environ.get("PROBE_KS", "7168,2048").split(",")]
N = 2112


def table(path):
    """The JSON lines as a table: times and each re-quantized tile's time over the plain GEMM's."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(rows[0]["device"], rows[0]["versions"])
    print("fmt       M      K   plain us  rq 128x128 us  rq 128x256 us  128x128/plain  128x256/plain  same bits")
    for r in rows:
        default, wide = r["rq_default_us"], r["rq_256_us"]
        print(f"{r['fmt']:4} {r['M']:6} {r['K']:6} {r['plain_us']:10.1f} {default:14.1f} {wide:14.1f} "
              f"{default / r['plain_us']:14.3f} {wide / r['plain_us']:14.3f}  {'yes' if r['same_bits'] else 'NO'}")


def main():
    # The GPU's modules only here: --table runs anywhere.
    import torch

    from quantcore import capability
    from quantcore.backends.triton import gluon_launch as gll
    from quantcore.bench.timing import gpu_times_us
    from stagger_probe import FMTS, PROFILE, checksum, operands  # this folder on sys.path

    def launch(cfg, a, a_s, w, w_s, requant):
        run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                    out_dtype=torch.bfloat16, out_quant=a.dtype if requant else None, out_group=128,
                                    ue8m0_out=False, eps=1e-4, profile=PROFILE, config=cfg)
        return lambda: run(a, a_s, w, w_s)

    for fname, fmt in FMTS.items():
        for K in KS:
            for M in MS:
                a, a_s, w, w_s, _ = operands(M, N, K, fmt)
                wide = gll.WIDE[0]
                if K <= gll.SHORT_K:
                    wide = dataclasses.replace(wide, group_m=gll.SHORT_K_GROUP_M)
                fns = [launch(gll.config_for(M, N, K, 128, None), a, a_s, w, w_s, False),
                       launch(gll.DEFAULT, a, a_s, w, w_s, True), launch(wide, a, a_s, w, w_s, True)]
                us = gpu_times_us(fns)
                print(json.dumps(dict(fmt=fname, M=M, N=N, K=K, plain_us=us[0], rq_default_us=us[1], rq_256_us=us[2],
                                      same_bits=checksum(fns[1]()) == checksum(fns[2]()),
                                      device=torch.cuda.get_device_name(), versions=capability.versions())), flush=True)
                del a, w
                torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        main()
