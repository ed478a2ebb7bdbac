"""Round-24 probe (H100): the Gluon GEMM with consumer 1 started a main loop behind consumer 0
(`GluonConfig.stagger`), so that the two warpgroups' epilogues no longer coincide.

Per format (FP8, INT8), PROBE_MS rows (default 4096,16384), the six bench shapes and epilogue (plain bf16, + a
bf16 bias, re-quantized per 1×128, bias + re-quantized; PROBE_EPIS picks), the configuration scaled_mm picks
(`gluon_launch.config_for`) with stagger off and on (the launch keeps it only where a tile's K blocks fit the ring),
timed interleaved (quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed, median of 15), the plain output
beside cuBLAS block-wise (FP8) or `torch._int_mm` (INT8, no scaling), with a checksum of both variants' output bits
(codes and scales), which must agree.

Usage: PYTHONPATH=<tree> python3 docs/bench/round24/stagger_probe.py TAG >> out.jsonl; `--parallel-warm` compiles
every case first (12 processes); PROBE_FMTS=fp8 (or int8) times one format only.
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from quantcore import capability, ops
from quantcore.backends.triton import gluon_launch as gll
from quantcore.bench import baselines
from quantcore.bench.shapes import DEEPSEEK_NK
from quantcore.bench.timing import gpu_times_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round19"))
from epilogue_ab import checksum  # noqa: E402  (round 19's: codes then scales, position-weighted)

PROFILE = capability.profile_for("cuda")
FMTS = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
EPILOGUES = {"plain": dict(), "bias": dict(bias=True), "requant": dict(requant=True),
             "bias+requant": dict(bias=True, requant=True), "bias+silu": dict(bias=True, activation="silu")}
MS = [int(m) for m in os.environ.get("PROBE_MS", "4096,16384").split(",")]
# The GluonConfig field varied and its values (lead_kb_probe.py sets its own).
FIELD, VALUES = "stagger", [False, True]
EPIS = os.environ.get("PROBE_EPIS", "plain,bias,requant,bias+requant").split(",")


def operands(M, N, K, fmt):
    g = torch.Generator(device="cuda").manual_seed(M + N + K)
    a, a_s = ops.act_quant(torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g), dtype=fmt)
    w, w_s = ops.weight_quant(torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05, dtype=fmt)
    return a, a_s, w, w_s, torch.randn(N, device="cuda", dtype=torch.bfloat16, generator=g)


def runner(value, a, a_s, w, w_s, bias, epi):
    """The prepared launch of config_for's configuration with FIELD = value."""
    M, K = a.shape
    N = w.shape[0]
    cfg = gll.config_for(M, N, K, 128, 128 if epi.get("requant") else None, epi.get("activation") is not None)
    b = bias if epi.get("bias") else None
    run = gll.scaled_mm.prepare(a, a_s, w, w_s, block_n=128, block_k=128, bias=b, activation=epi.get("activation"),
                                out_dtype=torch.bfloat16, out_quant=a.dtype if epi.get("requant") else None,
                                out_group=128, ue8m0_out=False, eps=1e-4, profile=PROFILE,
                                config=dataclasses.replace(cfg, **{FIELD: value}))
    return (lambda: run(a, a_s, w, w_s, b)), f"{cfg.block_m}x{cfg.block_n}"


def cases():
    for fname in os.environ.get("PROBE_FMTS", "fp8,int8").split(","):
        for M in MS:
            for N, K in DEEPSEEK_NK:
                yield fname, M, N, K


def main():
    if sys.argv[1] == "--warm":
        i, n = int(sys.argv[2]), int(sys.argv[3])
        for fname, M, N, K in list(cases())[i::n]:
            ops_ = operands(M, N, K, FMTS[fname])
            for e in EPIS:
                for v in VALUES:
                    runner(v, *ops_, EPILOGUES[e])[0]()
        torch.cuda.synchronize()
        return
    tag = sys.argv[1]
    for fname, M, N, K in cases():
        ops_ = operands(M, N, K, FMTS[fname])
        a, a_s, w, w_s, _ = ops_
        for e in EPIS:
            runs = [runner(v, *ops_, EPILOGUES[e]) for v in VALUES]
            fns = [r for r, _ in runs]
            if e == "plain":
                fns.append(baselines.cublas_blockwise_fp8(a, a_s, w, w_s) if fname == "fp8" else baselines.int_mm(a, w))
            us = gpu_times_us(fns)
            sums = [checksum(f()) for f in fns[:len(VALUES)]]
            print(json.dumps(dict(tag=tag, fmt=fname, M=M, N=N, K=K, epilogue=e, tile=runs[0][1],
                                  leads=[int(v) for v in VALUES],
                                  us=us[:len(VALUES)], base_us=us[len(VALUES)] if e == "plain" else None,
                                  same_bits=len(set(sums)) == 1, device=torch.cuda.get_device_name(),
                                  versions=capability.versions())), flush=True)
        del ops_, a, w
        torch.cuda.empty_cache()


def run(script):
    """The command line of `script` (this file or one that set FIELD and VALUES): --parallel-warm, --warm, or TAG."""
    if sys.argv[1:2] == ["--parallel-warm"]:
        procs = [subprocess.Popen([sys.executable, script, "--warm", str(i), "12"]) for i in range(12)]
        sys.exit(max(p.wait() for p in procs))
    main()


if __name__ == "__main__":
    run(__file__)
