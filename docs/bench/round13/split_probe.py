"""Round-13 probe (H100): K split over the tiled GEMM's second grid axis at 65-512 rows.

At 128 rows a plain tiling of N = 2112-7168 gives 17-56 output tiles of 128 columns for 132 SMs, and
the GEMMs ran at 0.2-0.4 of the memory floor (round 12's decode128_probe.txt: FP8 4096x4096 19.2 µs on
the Gluon GEMM, floor 5.6). Here the tiled kernel's configuration is forced (`configs.gemm_config`
patched) to each of a set of TILES (`tiles`: five shapes; `stages`: the 64x128 tile's stages and warps,
and 64x256), with K unsplit (waves 0) or split for about 1 or 2 programs per SM, each
split at least 4 K blocks (`configs._split`). Per format, M and shape (the six DeepSeek-V3 ones and the
decode model's three): GPU time (`timing.gpu_time_us`, bias, bf16 out) of each variant, of the shipped
selection, of the Gluon GEMM, of cuBLAS block-wise (FP8) and of torch's bf16 GEMM; each variant's output
against the reference (bf16 tolerance), bit for bit on a second call, and quant_linear (one launch where
the table quantizes once, its K split alike) bit for bit act_quant + that GEMM. Last, per format and M, the
geometric mean of each variant's time over the shipped selection's.

Run from the repository root: PYTHONPATH=$PWD python3 docs/bench/round13/split_probe.py [out.json|-] [M,M,...] [tiles|stages]
"""
import json
import statistics
import sys
from pathlib import Path

import torch

import quantcore
from quantcore import capability, ops, registry
from quantcore.backends.triton import configs
from quantcore.bench.timing import gpu_time_us
from quantcore.specs.tolerances import rel_error

dev = torch.device("cuda")
SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (4096, 7168), (7168, 16384), (32768, 512),
          (4096, 4096), (16384, 4096), (4096, 16384)]
TILE_SETS = {
    "tiles": {"64x64": configs.GemmConfig(64, 64, 4, 6), "64x128t": configs.GemmConfig(64, 128, 4, 4, tma=True),
              "128x64": configs.GemmConfig(128, 64, 4, 4), "128x128t": configs.GemmConfig(128, 128, 8, 4, tma=True),
              "128x128t2": configs.GemmConfig(128, 128, 8, 3, 2, tma=True)},
    # The chosen tile's stages and warps, and wider tiles.
    "stages": {f"64x{n}t_{w}w{s}s": configs.GemmConfig(64, n, w, s, tma=True)
               for n, w, s in ((128, 4, 4), (128, 4, 3), (128, 4, 6), (128, 8, 4), (128, 8, 6), (256, 4, 3), (256, 8, 4))},
}
TILES = TILE_SETS[sys.argv[3] if len(sys.argv) > 3 else "tiles"]
WAVES = (0, 1, 2)
MS = [int(m) for m in sys.argv[2].split(",")] if len(sys.argv) > 2 else [80, 128, 256, 512]
shipped = configs.gemm_config, configs.gemm_candidates
profile = capability.profile_for(dev)


def force(cfg):
    """The tiled kernel launched with `cfg` (None: the shipped table's choice), quant_linear's one launch
    past the decode rows split as it (`launch.fused_linear` reads the first candidate)."""
    configs.gemm_config, configs.gemm_candidates = shipped
    registry.reset()  # kept plans and cached tiles go (its cache clearing needs the real functions)
    if cfg is not None:
        configs.gemm_config, configs.gemm_candidates = (lambda *a, **k: cfg), (lambda *a, **k: (cfg,))


def variants(M, N, K):
    """"tile/wW" -> GemmConfig with the split W waves give this shape (several labels may share one)."""
    out = {}
    for name, tile in TILES.items():
        tiles = -(-M // tile.block_m) * -(-N // tile.block_n)
        for waves in WAVES:
            split, per = (1, 0) if not waves else configs._split(profile, tiles, -(-K // 128), waves, 4, tile.k_step)
            out[f"{name}/w{waves}"] = configs.GemmConfig(**{**tile.__dict__, "split_k": split, "kb_per_split": per})
    return out


def measure(M, qd, N, K):
    """One row: the selection, the baselines and every variant at M×N×K in format qd."""
    fmt = {torch.float8_e4m3fn: "fp8_e4m3", torch.int8: "int8"}[qd]
    torch.manual_seed(0)
    wf = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.05
    w, ws = ops.weight_quant(wf, dtype=qd)
    bias = torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.1
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    a, a_s = ops.act_quant(x, dtype=qd)
    ref = ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="torch")
    row = dict(fmt=fmt, M=M, N=N, K=K)
    force(None)
    row["sel_impl"] = quantcore.explain("scaled_mm", a, a_s, w, ws, bias).selected
    row["sel"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias))
    row["gluon"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="triton[gluon]"))
    if fmt == "fp8_e4m3":
        row["cublas"] = gpu_time_us(lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="torch[cublas]"))
    row["bf16"] = gpu_time_us(lambda: torch.nn.functional.linear(x, wf, bias))
    bad, timed = [], {}
    for name, cfg in variants(M, N, K).items():
        if cfg not in timed:
            force(cfg)
            mm = lambda: ops.scaled_mm(a, a_s, w, ws, bias=bias, backend="triton")
            out = mm()
            if rel_error(out, ref) > 1e-2 or not torch.equal(mm(), out):
                bad.append(name)
            # One launch where the table quantizes once past the decode rows: the tiled GEMM's bits.
            ql = ops.quant_linear(x, w, ws, bias, backend="triton")
            a2, a2_s = ops.act_quant(x, dtype=qd, backend="triton")
            if not torch.equal(ql, ops.scaled_mm(a2, a2_s, w, ws, bias=bias, backend="triton")):
                bad.append(name + ":ql")
            timed[cfg] = gpu_time_us(mm)
        row[name], row[name + ":split"] = timed[cfg], cfg.split_k
    force(None)
    keys = [k for k in row if "/" in k and ":" not in k]
    best = min(keys, key=lambda k: row[k])
    print(f"{fmt} {M}x{N}x{K}: sel[{row['sel_impl']}] {row['sel']:.1f} gluon {row['gluon']:.1f} "
          + (f"cublas {row['cublas']:.1f} " if "cublas" in row else "") + f"bf16 {row['bf16']:.1f} | "
          + " ".join(f"{k}s{row[k + ':split']} {row[k]:.1f}" for k in keys) + f" | best {best} {row[best]:.1f}"
          + (f" | BAD {bad}" if bad else ""), flush=True)
    return row


def summary(rows, fmt, M):
    """Per (tile, waves) label, the geometric mean of its time over the selection's, and the baselines'."""
    sel = [r for r in rows if r["fmt"] == fmt and r["M"] == M]
    keys = [k for k in sel[0] if "/" in k and ":" not in k]
    g = {k: statistics.geometric_mean([r[k] / r["sel"] for r in sel]) for k in keys}
    per_shape_best = statistics.geometric_mean([min(r[k] for k in keys) / r["sel"] for r in sel])
    base = {b: statistics.geometric_mean([r[b] / r["sel"] for r in sel]) for b in ("gluon", "cublas", "bf16")
            if all(b in r for r in sel)}
    print(f"geomean {fmt} M={M} time / selection: " + " ".join(f"{k} {v:.3f}" for k, v in sorted(g.items()))
          + f" | best per shape {per_shape_best:.3f} | " + " ".join(f"{k} {v:.3f}" for k, v in base.items()), flush=True)


print(torch.cuda.get_device_name(), torch.__version__, capability.versions(), flush=True)
rows = []
with torch.inference_mode():
    for M in MS:  # M outermost: a run cut short keeps whole M's
        for qd in (torch.float8_e4m3fn, torch.int8):
            rows += [measure(M, qd, N, K) for N, K in SHAPES]
        for fmt in ("fp8_e4m3", "int8"):
            summary(rows, fmt, M)
        if len(sys.argv) > 1 and sys.argv[1] != "-":
            Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))
