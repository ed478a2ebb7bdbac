"""Round-22 probe (H100): round 21's `requant_ab.py` with a re-quantized output whose scales are powers of
two (ue8m0) beside the fp32-scaled one: time over the plain GEMM, in the tree on PYTHONPATH, so that two
trees run alternately on one machine (`requant_ab.sh`) give a before/after.

Round 22 takes the amax with `max.NaN` (one FMNMX an element, where an integer maximum of the sign-cleared
bits took two), leaves out the division's rescaling for scales below 2^-64 where eps rules them out, encodes
INT8 codes with two full-rate float instructions and no clamp, and divides by a power-of-two scale with one
product an element. Epilogues: plain bf16, + a bf16 bias, re-quantized per 1×128 (fp32 scales, ue8m0
scales), bias + re-quantized; per format, PROBE_M rows (default 4096), the six bench shapes, each timed
interleaved with the plain GEMM (CUDA events, L2 flushed, median of 15) with a checksum of the output's bits.

Usage: PYTHONPATH=<tree> python3 docs/bench/round22/requant_ab.py TAG >> out.jsonl; `--parallel-warm`
compiles every case first (12 processes). PROBE_FMTS=int8 (or fp8) times one format only.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

# Round 21's probe, loaded by path (it has this file's name): round 19's epilogue_ab narrowed, PROBE_FMTS applied.
_spec = importlib.util.spec_from_file_location("round21_requant_ab",
                                               Path(__file__).resolve().parents[1] / "round21" / "requant_ab.py")
round21 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(round21)
epilogue_ab = round21.epilogue_ab
_cases = list(epilogue_ab.EPILOGUES.items())
epilogue_ab.EPILOGUES = dict(_cases[:3] + [("requant ue8m0", dict(requant=True, ue8m0=True))] + _cases[3:])


def runner(cfg, a, a_s, w, w_s, bias, epi):
    """Round 9's `gluon_staged.runner` with `ue8m0_out` from the epilogue."""
    run = epilogue_ab.gll.scaled_mm.prepare(
        a, a_s, w, w_s, block_n=128, block_k=128, bias=bias if epi.get("bias") else None,
        activation=epi.get("activation"), out_dtype=torch.bfloat16, out_quant=a.dtype if epi.get("requant") else None,
        out_group=128, ue8m0_out=epi.get("ue8m0", False), eps=1e-4, profile=epilogue_ab.profile, config=cfg)
    b = bias if epi.get("bias") else None
    return lambda: run(a, a_s, w, w_s, b)


epilogue_ab.runner = runner

if __name__ == "__main__":
    if sys.argv[1:2] == ["--parallel-warm"]:
        procs = [subprocess.Popen([sys.executable, __file__, "--warm", str(i), "12"]) for i in range(12)]
        sys.exit(max(p.wait() for p in procs))
    epilogue_ab.main()
