"""Round-25 probe (H100): N's last column tile with its sub-tiles past N skipped (`TAIL_NSUB`) at N = 2112, where
128×256 in 64-column sub-tiles leaves that tile one sub-tile of four (the kernel walks those tiles last, so that
the programs with one tile more than others take the short one).

Per format (FP8, INT8), PROBE_MS rows (default 4096,8192,16384), N = 2112, PROBE_KS (default 7168) and epilogue
(plain bf16, re-quantized per 1×128, bf16 bias + re-quantized): 128×128, 128×192 (plain only: it splits groups of
128) and 128×256 (group_m and stagger as `config_for` gives a wide tile), timed interleaved
(quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed, median of 15), with a checksum of each tile's output
bits (codes and scales), which must agree. Run in two trees (TAG names the tree), 128×256 is the padded tile without
or with the skip; the other tiles are the same kernels in both.

Usage: PYTHONPATH=<tree>:docs/bench/round24 python3 docs/bench/round25/tail_probe.py TAG >> out.jsonl (`--warm`:
compile every case and exit); `tail_probe.py --table out.jsonl` prints the table.
"""
import dataclasses
import json
import os
import sys

MS = [int(m) for m in os.environ.get("PROBE_MS", "4096,8192,16384").split(",")]
KS = [int(k) for k in os.environ.get("PROBE_KS", "7168").split(",")]
N = 2112
EPIS = {"plain": dict(), "requant": dict(requant=True), "bias+requant": dict(bias=True, requant=True)}


TILES = ("128x128", "128x192", "128x256")


def tiles(gll, K, epi):
    """The probe's tiles by name (`gll`: gluon_launch): 128×192 for the plain GEMM only, 128×256 with group_m and
    stagger as `config_for` gives a wide tile."""
    wide = gll.WIDE[0]
    if K <= gll.SHORT_K:
        wide = dataclasses.replace(wide, group_m=gll.SHORT_K_GROUP_M, stagger=True)
    out = {"128x128": gll.DEFAULT, "128x256": wide}
    if not epi.get("requant"):
        out["128x192"] = gll.WIDE[1]
    return out


def table(path, names=TILES):
    """The JSON lines as a table: each tile's time (the tiles `names`), and the fastest over the plain GEMM's
    fastest tile in the same run (the row before, as main prints them)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(rows[0]["device"], rows[0]["versions"])
    widths = [max(10, len(t) + 1) for t in names]
    print("tag   fmt       M      K epilogue       " + "".join(f"{t:>{w}}" for t, w in zip(names, widths))
          + "   best/plain  bits")
    for r in rows:
        if r["epilogue"] == "plain":
            best = min(r["us"].values())
        cells = "".join(f"{r['us'][t]:{w}.1f}" if t in r["us"] else f"{'-':>{w}}" for t, w in zip(names, widths))
        print(f"{r['tag']:5} {r['fmt']:4} {r['M']:6} {r['K']:6} {r['epilogue']:14} {cells} "
              f"{min(r['us'].values()) / best:12.3f}  {'yes' if r['same_bits'] else 'NO'}")


def main(tiles=tiles):
    """Time the tiles `tiles(gll, K, epi)` gives by name, one JSON line per case."""
    # The GPU's modules only here: --table runs anywhere.
    import torch

    from quantcore import capability
    from quantcore.backends.triton import gluon_launch as gll
    from quantcore.bench.timing import gpu_times_us
    from stagger_probe import FMTS, PROFILE, checksum, operands  # docs/bench/round24 on sys.path

    def launch(cfg, a, a_s, w, w_s, bias, epi):
        b = bias if epi.get("bias") else None
        run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=b, activation=None,
                                    out_dtype=torch.bfloat16, out_quant=a.dtype if epi.get("requant") else None,
                                    out_group=128, ue8m0_out=False, eps=1e-4, profile=PROFILE, config=cfg)
        return lambda: run(a, a_s, w, w_s, b)

    tag = sys.argv[1]
    for fname, fmt in FMTS.items():
        for K in KS:
            for M in MS:
                a, a_s, w, w_s, bias = operands(M, N, K, fmt)
                for e, epi in EPIS.items():
                    named = tiles(gll, K, epi)
                    fns = [launch(cfg, a, a_s, w, w_s, bias, epi) for cfg in named.values()]
                    if tag == "--warm":
                        for fn in fns:
                            fn()
                        continue
                    us = gpu_times_us(fns)
                    sums = {checksum(fn()) for fn in fns}
                    print(json.dumps(dict(tag=tag, fmt=fname, M=M, N=N, K=K, epilogue=e, us=dict(zip(named, us)),
                                          same_bits=len(sums) == 1, device=torch.cuda.get_device_name(),
                                          versions=capability.versions())), flush=True)
                del a, w
                torch.cuda.empty_cache()
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        main()
