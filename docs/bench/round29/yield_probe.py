"""Round-29 probe (H100): round 23's cublas_ab.py (the plain Gluon GEMM, config_for's tile, bf16 output, timed
interleaved with cuBLAS block-wise FP8 or `torch._int_mm` on the six bench shapes at PROBE_MS rows, with a checksum
of the output's bits) with the promotion FMAs' scheduling hints rewritten as each Gluon kernel is loaded
(`yield_patch.patched`, VARIANT = none / dg / all / alt); one JSON line per case. Processes of each variant
alternate (`yield_probe.sh`). `--table` prints any such JSON lines' table, one column per tag.

Usage: python3 docs/bench/round29/yield_probe.py VARIANT >> out.jsonl
       python3 docs/bench/round29/yield_probe.py --table out.jsonl
"""
import json
import math
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
import yield_patch  # noqa: E402

if sys.argv[1] == "--table":
    rows = [json.loads(line) for line in open(sys.argv[2])]
    variants = list(dict.fromkeys(r["tag"] for r in rows))
    cases = defaultdict(lambda: defaultdict(list))
    bits = defaultdict(set)
    for r in rows:
        key = (r["fmt"], r["m"], r["n"], r["k"])
        cases[key][r["tag"]].append(r["base_us"] / r["us"])
        cases[key][r["tag"] + " us"].append(r["us"])
        bits[key].add(r["bits"])
    print("baseline time / Gluon time, median over each variant's processes (µs of the Gluon GEMM beside it)")
    print(f"{'fmt':5}{'M':>6}{'N':>7}{'K':>7}  " + "  ".join(f"{v:>14}" for v in variants) + "  same bits")
    means = defaultdict(lambda: defaultdict(list))
    for key, per in cases.items():
        cells = []
        for v in variants:
            if not per[v]:
                cells.append(f"{'-':>14}")
                continue
            ratio = statistics.median(per[v])
            means[key[:2]][v].append(ratio)
            cells.append(f"{ratio:6.3f} {statistics.median(per[v + ' us']):7.1f}")
        print(f"{key[0]:5}{key[1]:>6}{key[2]:>7}{key[3]:>7}  " + "  ".join(cells) + f"  {'yes' if len(bits[key]) == 1 else 'NO'}")
    print("geometric mean (lowest) over the shapes")
    for (fmt, m), per in means.items():
        print(f"{fmt:5}{m:>6}  " + "  ".join(f"{v} {math.exp(sum(map(math.log, r)) / len(r)):.3f} ({min(r):.3f})"
                                        for v, r in per.items()))
    sys.exit()

import runpy  # noqa: E402

from triton.compiler import compiler as _compiler  # noqa: E402

TAG = sys.argv[1]
CHANGED = []
_load = _compiler.CompiledKernel._init_handles


def _patched_load(self):
    if self.module is None and self.name == "block_scaled_mm_ws_kernel":
        self.kernel, n = yield_patch.patched(self.kernel, self.name, TAG)
        CHANGED.append(n)
    _load(self)


_compiler.CompiledKernel._init_handles = _patched_load
# Round 23's probe, its Gluon kernels loaded through the hook above.
runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "round23", "cublas_ab.py"), run_name="__main__")
print(f"{TAG}: FFMAs rewritten per kernel loaded: {CHANGED}", file=sys.stderr)
