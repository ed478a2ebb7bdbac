"""Round-9 probe (H100): the split-K decode GEMM past 64 rows. At M = 128-512 a plain tiling has
N/128 × M/128 output tiles (33 for 2112 columns at 128 rows) on 132 SMs, each walking all of K; the
decode kernel splits K and, since this round, tiles M too (a third grid axis).

Per format (FP8, INT8), M in (128, 256, 512) and (N, K) in the six bench shapes and the decode model's
three: GPU time of the current selection (`ops.scaled_mm`), of `triton[gluon]`, of the tiled Triton
kernel, of cuBLAS block-wise behind quantcore (`torch[cublas]`, FP8), of torch's bf16 linear, and of
the decode kernel under twelve launches: rows per program BLOCK_M 64 or 128, (BLOCK_N, warps) (64, 4),
(128, 4) or (128, 8), K split for 1 or 2 programs per SM (at least 2 K blocks a split), 4 stages where
the tiles fit shared memory (fewer where not). Every decode output is compared with the reference's.

Kernels are compiled first by worker processes (harness.py).

Ran at 201f7d9, whose decode kernel has the row-tile axis (reverted after this run): `git checkout
201f7d9`, then from the repository root: PYTHONPATH=$PWD python3 docs/bench/round9/decode_m.py [out.json]
GPU times: quantcore.bench.timing.gpu_time_us (CUDA events, L2 flushed, median of 15).
"""
import traceback

import torch
import torch.nn.functional as F

from quantcore import capability, ops
from quantcore.backends.triton import configs, launch
from quantcore.bench.timing import gpu_time_us

import harness
from harness import geomean

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512), (4096, 4096),
          (16384, 4096), (4096, 16384)]
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
MS = (128, 256, 512)
VARIANTS = [(bm, bn, w, waves) for bm in (64, 128) for bn, w in ((64, 4), (128, 4), (128, 8)) for waves in (1, 2)]
dev = "cuda"
profile = capability.profile_for(torch.device(dev))


def decode_cfg(M, N, K, bm, bn, warps, waves):
    kbs = -(-K // 128)
    tiles = -(-N // bn) * -(-M // bm)
    split = max(1, min(round(waves * profile.sm_count / tiles), kbs // 2))
    per = -(-kbs // split)
    stages = 4
    while stages > 2 and stages * (bn + bm) * 128 + 1024 > profile.smem_per_block:
        stages -= 1
    return configs.DecodeConfig(bm, bn, warps, stages, -(-kbs // per), per)


def decode_runner(cfg, a, a_s, w, w_s):
    orig = configs.decode_m_max, configs.decode_config
    configs.decode_m_max = lambda *args, **kw: 1 << 20
    configs.decode_config = lambda *args, **kw: cfg
    try:
        run = launch.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=None, activation=None,
                                       out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                       eps=1e-4, profile=profile, mma="fp8" if a.dtype == torch.float8_e4m3fn else "int8")
    finally:
        configs.decode_m_max, configs.decode_config = orig
    return lambda: run(a, a_s, w, w_s)


def operands(M, N, K, fmt):
    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    wb = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05
    a, a_s = ops.act_quant(x, dtype=fmt)
    w, w_s = ops.weight_quant(wb, dtype=fmt)
    return x, wb, a, a_s, w, w_s


def cases():
    for fname, fmt in FMTS.items():
        for M in MS:
            for N, K in SHAPES:
                yield fname, fmt, M, N, K


def warm(worker, workers):
    """Run this worker's share of the decode launches once (compiling them into Triton's cache)."""
    jobs = [(c, v) for c in cases() for v in VARIANTS]
    for i, ((fname, fmt, M, N, K), v) in enumerate(jobs):
        if i % workers != worker:
            continue
        try:
            _, _, a, a_s, w, w_s = operands(M, N, K, fmt)
            decode_runner(decode_cfg(M, N, K, *v), a, a_s, w, w_s)()
        except Exception:
            traceback.print_exc()
    torch.cuda.synchronize()


def measure():
    rows = []
    for fname, fmt, M, N, K in cases():
        try:
            x, wb, a, a_s, w, w_s = operands(M, N, K, fmt)
            ref = ops.scaled_mm(a, a_s, w, w_s, backend="torch", out_dtype=torch.float32)
            row = dict(fmt=fname, M=M, N=N, K=K)
            row["selected"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s))
            row["bf16"] = gpu_time_us(lambda: F.linear(x, wb))
            for b in ("triton[gluon]", "triton", "torch[cublas]") if fname == "fp8" else ("triton[gluon]", "triton"):
                row[b] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, w_s, backend=b))
            best = None
            for v in VARIANTS:
                cfg = decode_cfg(M, N, K, *v)
                run = decode_runner(cfg, a, a_s, w, w_s)
                err = float(((run().float() - ref).norm() / ref.norm()))
                t = gpu_time_us(run)
                key = f"decode bm{v[0]} bn{v[1]} w{v[2]} waves{v[3]} (split {cfg.split_k}, st {cfg.num_stages})"
                row[key] = t
                row.setdefault("max_rel_err", 0.0)
                row["max_rel_err"] = max(row["max_rel_err"], err)
                if best is None or t < best[1]:
                    best = (key, t)
            row["best_decode"] = best
            rows.append(row)
            print(f"{fname} {M:4d}x{N:5d}x{K:<5d} sel {row['selected']:6.1f} gluon {row['triton[gluon]']:6.1f} "
                  f"tiled {row['triton']:6.1f} bf16 {row['bf16']:6.1f}"
                  + (f" cublas {row['torch[cublas]']:6.1f}" if fname == "fp8" else "")
                  + f" | best decode {best[1]:6.1f} {best[0]} | err {row['max_rel_err']:.2e}", flush=True)
        except Exception:
            traceback.print_exc()
    print("\nGeomean over the shapes of selected time / decode time, per variant (> 1: decode faster)")
    for fname in FMTS:
        for M in MS:
            rs = [r for r in rows if r["fmt"] == fname and r["M"] == M]
            if not rs:
                continue
            per = {}
            for v in VARIANTS:
                tag = f"decode bm{v[0]} bn{v[1]} w{v[2]} waves{v[3]} "
                per[tag] = geomean([r["selected"] / next(r[k] for k in r if k.startswith(tag)) for r in rs])
            top = sorted(per.items(), key=lambda kv: -kv[1])[:4]
            print(f"{fname} M={M}: best-per-shape {geomean([r['selected'] / r['best_decode'][1] for r in rs]):.3f}; "
                  + "; ".join(f"{k.strip()} {g:.3f}" for k, g in top)
                  + f"; bf16/selected {geomean([r['bf16'] / r['selected'] for r in rs]):.3f}"
                  + f"; bf16/best {geomean([r['bf16'] / r['best_decode'][1] for r in rs]):.3f}", flush=True)
    return rows


if __name__ == "__main__":
    harness.main(__file__, measure, warm)
