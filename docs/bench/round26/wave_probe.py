"""Round-26 probe (H100): the plain GEMM's last wave at 16384 rows. On 128×256, N = 4096 and 7168 give 2048 and
3584 tiles, 15.5 and 27.2 for 132 programs, so the last round of tiles leaves 48 % and 85 % of the programs idle.
128×192 in 64-column sub-tiles has a last column tile of one sub-tile (N % 192 = 64) that the kernel skips down to
that sub-tile and walks after the whole ones. Run in the tree of `balance.diff`, which hands those short tiles
first to the programs with a whole tile fewer: 63 and 109 sub-tiles for the busiest program against 64 and 112 on
128×256, at 17 % more A and B bytes per FLOP (the shipped strided walk: 64 and 109).

Per format (PROBE_FMTS, default fp8,int8), PROBE_MS rows (default 16384) and the bench shapes of N 4096 and 7168: the
plain bf16 GEMM on 128×256 (`config_for`'s) and on 128×192, and cuBLAS block-wise (FP8) or `torch._int_mm` (INT8),
timed interleaved (quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed, median of 15), with a checksum of
both tiles' output bits, which must agree.

Usage: PYTHONPATH=.:docs/bench/round24 python3 docs/bench/round26/wave_probe.py TAG >> out.jsonl (`--warm`: compile
every case and exit); `wave_probe.py --table out.jsonl` prints the table.
"""
import json
import os
import sys

SHAPES = [(4096, 7168), (7168, 16384), (7168, 2048)]


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(rows[0]["device"], rows[0]["versions"])
    print("tag    fmt       M      N      K   128x256   128x192    vendor  192/256  vendor/256  vendor/192  bits")
    for r in rows:
        us = r["us"]
        print(f"{r['tag']:6} {r['fmt']:4} {r['M']:6} {r['N']:6} {r['K']:6} {us['128x256']:9.1f} {us['128x192']:9.1f} "
              f"{r['vendor_us']:9.1f} {us['128x192'] / us['128x256']:8.3f} {r['vendor_us'] / us['128x256']:11.3f} "
              f"{r['vendor_us'] / us['128x192']:11.3f}  {'yes' if r['same_bits'] else 'NO'}")


def main():
    import dataclasses

    import torch

    from quantcore import capability
    from quantcore.backends.triton import gluon_launch as gll
    from quantcore.bench import baselines
    from quantcore.bench.timing import gpu_times_us
    from stagger_probe import FMTS, PROFILE, checksum, operands  # docs/bench/round24 on sys.path

    def launch(cfg, a, a_s, w, w_s):
        run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                    out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                    eps=1e-4, profile=PROFILE, config=cfg)
        return lambda: run(a, a_s, w, w_s)

    tag = sys.argv[1]
    for fname in os.environ.get("PROBE_FMTS", "fp8,int8").split(","):
        for M in [int(m) for m in os.environ.get("PROBE_MS", "16384").split(",")]:
            for N, K in SHAPES:
                a, a_s, w, w_s, _bias = operands(M, N, K, FMTS[fname])
                wide = gll.config_for(M, N, K, 128, None)
                narrow = gll.WIDE[1]
                if K <= gll.SHORT_K:
                    narrow = dataclasses.replace(narrow, group_m=wide.group_m, stagger=wide.stagger)
                fns = [launch(cfg, a, a_s, w, w_s) for cfg in (wide, narrow)]
                if tag == "--warm":
                    for fn in fns:
                        fn()
                    continue
                sums = {checksum(fn()) for fn in fns}
                fns.append(baselines.cublas_blockwise_fp8(a, a_s, w, w_s) if fname == "fp8" else baselines.int_mm(a, w))
                us = gpu_times_us(fns)
                print(json.dumps(dict(tag=tag, fmt=fname, M=M, N=N, K=K, us={"128x256": us[0], "128x192": us[1]},
                                      vendor_us=us[2], same_bits=len(sums) == 1, device=torch.cuda.get_device_name(),
                                      versions=capability.versions())), flush=True)
                del a, w
                torch.cuda.empty_cache()
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        main()
