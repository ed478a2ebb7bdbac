"""Round-37 probe (H100): consumer 1's K loop shifted by `GluonConfig.shift` column sub-tiles against config_for's
kernel (shift 0), timed interleaved with cuBLAS block-wise FP8 or `torch._int_mm` on the six bench shapes at PROBE_MS
rows; round 36's probe (`aregs_probe.py`: timing, checksums, PROBE_WARM, one JSON line per case and variant) with
these variants: base, s1, s2, s3 (each shift below the tile's column sub-tiles).

Usage: python3 docs/bench/round37/shift_probe.py TAG >> out.jsonl   (table: round36/aregs_table.py)
"""
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "round36"))
import aregs_probe as probe  # noqa: E402
from quantcore.backends.triton import gluon_launch as gl  # noqa: E402


def variants(m, n, k, fmt):
    """name -> GluonConfig: config_for's tile, then the same with each shift it has room for."""
    base = gl.config_for(max(m, gl.WIDE_M_MIN), n, k, 128, None)
    return {"base": base} | {f"s{s}": replace(base, shift=s) for s in (1, 2, 3) if s < base.block_n // base.sub}


probe.variants = variants

if __name__ == "__main__":
    if probe.WARM:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(int(os.environ.get("PROBE_JOBS", "8"))) as pool:
            pool.starmap(probe.run_case, list(probe.cases()))
    else:
        for case in probe.cases():
            probe.run_case(*case)
            probe.torch.cuda.empty_cache()
