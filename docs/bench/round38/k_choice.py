"""Per shape of a GEMM bench run (FP8, 512-16384 rows): the Gluon GEMM's and cuBLAS block-wise's times, what a
table ranked per M only and one ranked per M and K put first, and the time the per-K table saves.
Usage: PYTHONPATH=<repo> python3 k_choice.py RUN.json
"""
import json
import math
import sys
import tempfile
from pathlib import Path

from quantcore import measured, registry
from quantcore.bench.run import BenchResult
from quantcore.bench.summary import write_priority

result = BenchResult.model_validate(json.loads(Path(sys.argv[1]).read_text()))
table = json.loads(write_priority(result, Path(tempfile.mkdtemp())).read_text())
us = {(tuple(r.shape), r.impl): r.us for r in result.records if r.op == "scaled_mm" and r.fmt == "fp8_e4m3" and r.us}
shapes = sorted({s for s, _ in us if s[0] >= 512})
print(f"{'M':>6} {'N':>6} {'K':>6} {'gluon us':>9} {'cublas us':>9}  {'per M':<14} {'per M and K':<14} saved")
gains: dict[int, list[float]] = {}
for m, n, k in shapes:
    def first(by_m):
        return by_m[str(max(int(b) for b in by_m if int(b) <= registry.m_bucket(m)))][0]
    per_k = table["by_k"]["scaled_mm/fp8_e4m3"]
    k_key = str(max([int(b) for b in per_k if int(b) <= registry.k_bucket(k)] or [min(map(int, per_k))]))
    old, new = first(table["priority"]["scaled_mm/fp8_e4m3"]), first(per_k[k_key])
    t_old, t_new = us[((m, n, k), old)], us[((m, n, k), new)]
    gains.setdefault(m, []).append(math.log(t_old / t_new))
    print(f"{m:>6} {n:>6} {k:>6} {us[((m, n, k), 'triton[gluon]')]:>9.1f} {us[((m, n, k), 'torch[cublas]')]:>9.1f}  "
          f"{old:<14} {new:<14} {100 * (1 - t_new / t_old):+.1f} %")
for m, g in gains.items():
    print(f"M {m}: time of the per-M choice over the per-K choice, geometric mean {math.exp(sum(g) / len(g)):.3f}")
