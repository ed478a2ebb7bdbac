"""Round-33 probe (H100), on a tree with alternate.diff applied (not shipped): the two consumer warpgroups' wgmmas
issued in turn through a named barrier (`GluonConfig.alternate`: consumer 0 enters it before each wgmma's issue,
consumer 1 after its own, the order cuBLAS's block-wise kernel keeps between its two consumers), timed interleaved
(`timing.gpu_times_us`) beside cuBLAS block-wise FP8 / `torch._int_mm`; every output compared bit for bit with the
shipped configuration's. One JSON line per case.

VARIANTS=alt (default): base (config_for), alt (config_for with alternate and without stagger, which would deadlock
beside it: consumer 0 would wait at the barrier for consumer 1, and consumer 1 for consumer 0's first main loop), and
where config_for staggers, nostag (config_for without stagger, alt's control); FP8 and INT8 at 512, 4096 and 16384
rows. VARIANTS=square: cuBLAS's structure on the 128×128 tile, FP8 at 4096 and 16384 rows: sq (the 128×128 tile as
shipped: two K blocks a step, the second's wgmma under the first's promotion), sq_np (one K block a step, one
partial: each warpgroup waits for its wgmma before promoting it), sq_np_alt (the same, the consumers alternating).
VARIANTS=smem, on a tree with smem_scales.diff applied instead: base, and smem (the scales staged in shared memory by
the producer, `GluonConfig.smem_scales`; the wide tile held at 4 stages, which the launch's estimate would cut to 3).

Usage: python3 alt_probe.py TAG >> out.jsonl;  python3 alt_probe.py --warm I N;  python3 alt_probe.py --table out.jsonl
"""
import json
import math
import os
import statistics
import sys
from dataclasses import replace

from quantcore.bench.shapes import DEEPSEEK_NK as SHAPES  # the six bench shapes (N, K)

VARIANTS = os.environ.get("VARIANTS", "alt")
CASES = [(f, m, n, k) for f in ("fp8", "int8") for m in (512, 4096, 16384) for n, k in SHAPES]
if VARIANTS == "square":
    CASES = [(f, m, n, k) for f in ("fp8", ) for m in (4096, 16384) for n, k in SHAPES]


def main():
    import torch

    from quantcore import capability, ops
    from quantcore.backends.triton import gluon_launch as gl
    from quantcore.bench import baselines, timing
    fmts = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
    profile = capability.profile_for("cuda")
    warm = sys.argv[1] == "--warm"
    part = CASES[int(sys.argv[2])::int(sys.argv[3])] if warm else CASES
    for fmt, m, n, k in part:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=fmts[fmt])
        b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=fmts[fmt])
        base = gl.config_for(m, n, k, 128, None)
        if VARIANTS == "smem":  # on a tree with smem_scales.diff instead
            cfgs = {"base": base, "smem": replace(base, smem_scales=True, stages=4 if base.block_n == 256 else None)}
        elif VARIANTS == "square":
            d = gl.GluonConfig()
            cfgs = {"base": base, "sq": d, "sq_np": replace(d, pipeline=False),
                    "sq_np_alt": replace(d, pipeline=False, alternate=True)}
        else:
            cfgs = {"base": base, "alt": replace(base, alternate=True, stagger=False)}
            if base.stagger:
                cfgs["nostag"] = replace(base, stagger=False)
        fns = {}
        for name, cfg in cfgs.items():
            run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=profile, config=cfg)
            fns[name] = lambda run=run: run(a, a_s, b, b_s)
        if warm:
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            continue
        ref = fns["base"]().view(torch.int16).clone()
        same = {name: torch.equal(fn().view(torch.int16), ref) for name, fn in fns.items()}
        fns["vendor"] = baselines.cublas_blockwise_fp8(a, a_s, b, b_s) if fmt == "fp8" else baselines.int_mm(a, b)
        us = dict(zip(fns, timing.gpu_times_us(list(fns.values()))))
        print(json.dumps(dict(run=sys.argv[1], fmt=fmt, m=m, n=n, k=k, tile=f"{base.block_m}x{base.block_n}",
                              us=us, same=same, device=torch.cuda.get_device_name(),
                              versions=capability.versions())), flush=True)
        del a, b, ref, fns
        torch.cuda.empty_cache()


def table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print(rows[0]["device"], rows[0]["versions"])
    names = list(dict.fromkeys(n for r in rows for n in r["us"] if n != "vendor"))
    print("vendor time / ours (cuBLAS block-wise for FP8, _int_mm for INT8), median over runs")
    print("fmt      M      N      K  tile     vendor us   " + "  ".join(f"{n:>7}" for n in names) + "  same bits")
    cells = {}
    for key in dict.fromkeys((r["fmt"], r["m"], r["n"], r["k"]) for r in rows):
        mine = [r for r in rows if (r["fmt"], r["m"], r["n"], r["k"]) == key]
        ratio = {n: statistics.median(r["us"]["vendor"] / r["us"][n] for r in mine) for n in names if n in mine[0]["us"]}
        cells[key] = ratio
        same = all(all(r["same"].values()) for r in mine)
        print(f"{key[0]:4} {key[1]:6} {key[2]:6} {key[3]:6}  {mine[0]['tile']:8} {statistics.median(r['us']['vendor'] for r in mine):9.1f}   "
              + "  ".join(f"{ratio[n]:7.3f}" if n in ratio else "       " for n in names) + f"  {'yes' if same else 'NO'}")
    print("geometric mean (lowest) over the six shapes")
    for fm in dict.fromkeys((k[0], k[1]) for k in cells):
        mine = [v for k, v in cells.items() if (k[0], k[1]) == fm]
        out = []
        for n in [n for n in names if n in mine[0]]:
            vals = [v[n] for v in mine]
            out.append(f"{n} {math.exp(sum(map(math.log, vals)) / len(vals)):.3f} ({min(vals):.3f})")
        print(f"{fm[0]:4} {fm[1]:6}  " + "  ".join(out))


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        main()
