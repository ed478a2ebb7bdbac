"""Round-36 probe (H100): the Gluon GEMM with each K block's A rows read into registers once (`GluonConfig.a_regs`)
against the shipped kernel, which has every column sub-tile's wgmma read them from shared memory again, timed
interleaved with cuBLAS block-wise FP8 (`torch._scaled_mm`) or, for INT8, `torch._int_mm`, on the six bench shapes
at PROBE_MS rows; one JSON line per case and variant, with a checksum of the output's bits.

Variants by PROBE_SET (every output's bits compared with base's):
- unset (the tree of a_regs.diff): base (config_for's tile), areg (the same with a_regs), t192 / t192a (128×192 in
  64-column sub-tiles, without / with a_regs), w32a (128×256 in 32-column sub-tiles with a_regs);
- the rest on the tree of probe_variants.diff, whose `GluonConfig.depth` is the wgmmas a consumer keeps in flight (2 as
  shipped) or, at 0, 12 and 22, a probe's schedule:
  - depth: base, t192 and t192d3 (128×192 at depth 2 and 3), each config once (at N = 2112 base is t192);
  - promote (FP8 only): base, d12 (K block 0's scales for every K block: no scale load in the K loop), d0 (no
    promotion: each K block's wgmmas accumulate into the accumulators themselves, so that only the ring, the wgmmas
    and the epilogue remain), both wrong by design, and cuBLAS's tensor-wise FP8 GEMM (`cublas_tw`, no per-block
    promotion either); call 5 ran it before d12 was added;
  - late: base, late (depth 22: each promotion's scale product tied to its waited partial by an exact identity, so
    that ptxas cannot put it, and so the wait for the scale loads, ahead of the K block's first wgmma; same bits)
    and d12;
  - ahead: base, ahead (depth 32: each K block's scales loaded at the start of the K block before, their products
    formed at its end, tied to its last accumulator; same bits) and d12.
PROBE_WARM=1 only compiles every variant (at 256 rows, in PROBE_JOBS processes), so that the timed run finds them in
Triton's cache.

Usage: PYTHONPATH=<tree> python3 docs/bench/round36/aregs_probe.py TAG >> out.jsonl
"""
import json
import os
import sys
from dataclasses import replace

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gl
from quantcore.bench import baselines, timing
from quantcore.bench.shapes import DEEPSEEK_NK

TAG = sys.argv[1]
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
MS = [int(m) for m in os.environ.get("PROBE_MS", "4096,16384").split(",")]
WARM = os.environ.get("PROBE_WARM") == "1"


def checksum(bits: torch.Tensor) -> int:
    """A position-weighted sum of the output's 16-bit words, on the GPU."""
    flat = bits.reshape(-1).to(torch.int64)
    return int((flat * (torch.arange(flat.numel(), device=flat.device) % 65521 + 1)).sum())


def variants(m, n, k, fmt):
    """name -> GluonConfig of the variants timed at this shape."""
    base = gl.config_for(max(m, gl.WIDE_M_MIN), n, k, 128, None)
    short = dict(group_m=gl.SHORT_K_GROUP_M, stagger=True) if k <= gl.SHORT_K else {}
    t192 = gl.GluonConfig(block_n=192, sub_n=64, **short)
    if os.environ.get("PROBE_SET") == "promote":
        return {"base": base, "d12": replace(base, depth=12), "d0": replace(base, depth=0)}
    if os.environ.get("PROBE_SET") == "ahead":
        return {"base": base, "ahead": replace(base, depth=32), "d12": replace(base, depth=12)}
    if os.environ.get("PROBE_SET") == "late":
        return {"base": base, "late": replace(base, depth=22), "d12": replace(base, depth=12)}
    if os.environ.get("PROBE_SET") == "depth":
        out = {"base": base, "t192": t192, "t192d3": replace(t192, depth=3)}
        return {name: cfg for i, (name, cfg) in enumerate(out.items()) if cfg not in list(out.values())[:i]}
    out = {"base": base, "areg": replace(base, a_regs=True)}
    if fmt == "fp8":
        out["t192a"] = replace(t192, a_regs=True)
        if base.block_n != 192:
            out["t192"] = t192
        out["w32a"] = replace(gl.WIDE[0], sub_n=32, a_regs=True, **short)
    return out


def cases():
    for fmt in os.environ.get("PROBE_FMTS", "fp8,int8").split(","):
        for m in ([256] if WARM else MS):
            for n, k in DEEPSEEK_NK:
                yield fmt, m, n, k


def run_case(fmt, m, n, k):
    profile = capability.profile_for("cuda")
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, a_s = ops.act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
    b, b_s = ops.weight_quant(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g), dtype=FMTS[fmt])
    runs = {}
    for name, cfg in variants(m, n, k, fmt).items():
        run = gl.scaled_mm.prepare(a, a_s, b, b_s, block_n=128, block_k=128, bias=None, activation=None,
                                   out_dtype=torch.bfloat16, out_quant=None, out_group=128, ue8m0_out=False,
                                   eps=1e-4, profile=profile, config=cfg)
        runs[name] = (cfg, lambda run=run: run(a, a_s, b, b_s))
    if os.environ.get("PROBE_SET") == "promote":
        runs["cublas_tw"] = (None, baselines.cublas_tensorwise_fp8(a, b))
    if WARM:
        for _cfg, fn in runs.values():
            fn()
        torch.cuda.synchronize()
        return
    base = baselines.cublas_blockwise_fp8(a, a_s, b, b_s) if fmt == "fp8" else baselines.int_mm(a, b)
    times = timing.gpu_times_us([fn for _cfg, fn in runs.values()] + [base])
    for (name, (cfg, fn)), us in zip(runs.items(), times):
        print(json.dumps(dict(tag=TAG, variant=name, fmt=fmt, m=m, n=n, k=k, tile=cfg and f"{cfg.block_m}x{cfg.block_n}/{cfg.sub}",
                              us=us, base_us=times[-1], bits=checksum(fn().view(torch.int16)))), flush=True)


if __name__ == "__main__":
    if WARM:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(int(os.environ.get("PROBE_JOBS", "8"))) as pool:
            pool.starmap(run_case, list(cases()))
    else:
        for case in cases():
            run_case(*case)
            torch.cuda.empty_cache()
