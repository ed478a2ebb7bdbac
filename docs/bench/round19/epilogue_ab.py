"""Round-19 probe (H100): the Gluon GEMM's fused epilogues, time over the plain GEMM, in the tree on
PYTHONPATH, so that two trees run alternately on one machine (`epilogue_ab.sh`) give a before/after.

Per format (FP8, INT8), 4096 rows (PROBE_M in the environment), the six bench shapes and epilogue (plain
bf16; + a bf16 bias; a re-quantized output per 1×128; bias + SiLU; bias + GELU; bias + GELU re-quantized):
the GPU time of the configuration scaled_mm picks itself (`gluon_launch.config_for`), timed interleaved
with the plain GEMM of the same shape (quantcore.bench.timing.gpu_times_us: CUDA events, L2 flushed,
median of 15), and a checksum of the output's bits (codes and scales), which the two trees must share.

The epilogue_*.txt runs predate its use of round 9's operands and runner (the same calls, which
requant_path_rerun.txt and quant_ops_ab_cupy.txt ran through this module afterwards).

Usage: PYTHONPATH=<tree> python3 docs/bench/round19/epilogue_ab.py TAG >> out.jsonl (one JSON line per
case); `--warm i n` compiles every n-th case from the i-th (run in parallel first: the disk cache then
holds them).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from quantcore import capability
from quantcore.bench.timing import gpu_times_us

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round9"))
# Round 9's shapes, operands and prepared launch (config None: the one scaled_mm picks).
from gluon_staged import FMTS, SHAPES, gll, operands, profile, runner  # noqa: E402

EPILOGUES = {"plain": dict(), "bias": dict(bias=True), "requant": dict(requant=True),
             "bias+silu": dict(bias=True, activation="silu"), "bias+gelu": dict(bias=True, activation="gelu"),
             "bias+gelu+requant": dict(bias=True, activation="gelu", requant=True)}
M = int(os.environ.get("PROBE_M", 4096))


def checksum(out) -> int:
    """A position-weighted sum of the output's bytes (codes then scales for a re-quantized one)."""
    total = 0
    for t in out if isinstance(out, tuple) else (out, ):
        bits = t.contiguous().view(torch.uint8).flatten().to(torch.int64)
        total += int((bits * (torch.arange(bits.numel(), device=bits.device) % 65521 + 1)).sum())
    return total


def cases():
    for fname in FMTS:
        for N, K in SHAPES:
            yield fname, N, K


def main():
    if sys.argv[1] == "--warm":
        i, n = int(sys.argv[2]), int(sys.argv[3])
        jobs = [(c, e) for c in cases() for e in EPILOGUES]
        for fname, N, K in {c for c, _ in jobs[i::n]}:
            ops_ = operands(M, N, K, FMTS[fname])
            for c, e in jobs[i::n]:
                if c == (fname, N, K):
                    runner(None, *ops_, EPILOGUES[e])()
        torch.cuda.synchronize()
        return
    tag = sys.argv[1]
    for fname, N, K in cases():
        ops_ = operands(M, N, K, FMTS[fname])
        plain = runner(None, *ops_, {})
        for e, epi in EPILOGUES.items():
            run = runner(None, *ops_, epi)
            t_plain, t = gpu_times_us([plain, run])
            print(json.dumps(dict(tag=tag, fmt=fname, M=M, N=N, K=K, epilogue=e, us=t, plain_us=t_plain,
                                  checksum=checksum(run()), device=torch.cuda.get_device_name(),
                                  versions=capability.versions())), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--parallel-warm"]:
        procs = [subprocess.Popen([sys.executable, __file__, "--warm", str(i), "12"]) for i in range(12)]
        sys.exit(max(p.wait() for p in procs))
    main()
