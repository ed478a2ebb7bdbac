"""Round-21 probe (H100): the Gluon GEMM's re-quantized output on the tile scaled_mm picks, time over the
plain GEMM, in the tree on PYTHONPATH, so that two trees run alternately on one machine (`requant_ab.sh`)
give a before/after.

Until round 20 a re-quantized output in groups of 128 took the default 128×128 tile at every M, where the
plain GEMM takes 128×256 (or 128×192) in 64-column sub-tiles from 4096 rows: a group had to lie within one
sub-tile. Round 21's `gluon_gemm._requantized` takes the amax of a group over two sub-tiles, so
`config_for` gives re-quantized outputs the wide tile where it holds whole groups.

Round 19's `epilogue_ab.py` (round 9's shapes, operands and prepared launch, config None), with its
epilogues narrowed to the plain GEMM, a bias (unchanged: the control), a re-quantized output per 1×128 and
both: per format (FP8, INT8), PROBE_M rows (default 4096), the six bench shapes, the GPU time timed
interleaved with the plain GEMM of the same shape (CUDA events, L2 flushed, median of 15) and a checksum
of the output's bits, which the two trees must share.

Usage: PYTHONPATH=<tree> python3 docs/bench/round21/requant_ab.py TAG >> out.jsonl; `--parallel-warm`
compiles every case first (12 processes). PROBE_FMTS=int8 (or fp8) times one format only.
"""
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round19"))
import epilogue_ab  # noqa: E402

if os.environ.get("PROBE_FMTS"):
    epilogue_ab.FMTS = {f: epilogue_ab.FMTS[f] for f in os.environ["PROBE_FMTS"].split(",")}
epilogue_ab.EPILOGUES = {"plain": dict(), "bias": dict(bias=True), "requant": dict(requant=True),
                         "bias+requant": dict(bias=True, requant=True)}

if __name__ == "__main__":
    if sys.argv[1:2] == ["--parallel-warm"]:
        procs = [subprocess.Popen([sys.executable, __file__, "--warm", str(i), "12"]) for i in range(12)]
        sys.exit(max(p.wait() for p in procs))
    epilogue_ab.main()
