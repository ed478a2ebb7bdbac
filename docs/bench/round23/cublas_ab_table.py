"""The table of `cublas_ab.py`'s JSON lines (argv[1]): per format, rows and shape the median Gluon time of each
tag (each tree; round 32's barrier_probe.sh: each variant), its ratio to the baseline timed beside it (baseline time / Gluon time: above 1 is faster) and whether the
output bits agree across every process; then per format and rows the geometric mean and lowest ratio."""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
cases = defaultdict(lambda: defaultdict(list))
for r in rows:
    cases[(r["fmt"], r["m"], r["n"], r["k"], r["tile"])][r["tag"]].append(r)
tags = list(dict.fromkeys(r["tag"] for r in rows))  # "base", "new" as cublas_ab.sh writes them; any others alike
print("fmt  M      N      K      tile    " + "".join(f"{tag + ' us':>10}{'ratio':>7}" for tag in tags) + "  same bits")
means = defaultdict(lambda: defaultdict(list))
for (fmt, m, n, k, tile), by_tag in cases.items():
    line = f"{fmt:4} {m:5} {n:6} {k:6}  {tile:8}"
    for tag in tags:
        runs = by_tag.get(tag, [])
        if not runs:
            line += "        -      -"
            continue
        us = statistics.median(r["us"] for r in runs)
        ratio = statistics.median(r["base_us"] / r["us"] for r in runs)
        means[(fmt, m)][tag].append(ratio)
        line += f"  {us:8.1f}  {ratio:5.3f}"
    bits = {r["bits"] for runs in by_tag.values() for r in runs}
    print(line + ("  yes" if len(bits) == 1 else "  NO"))
print("\nBaseline time / Gluon time over the six shapes: geometric mean (lowest)")
for (fmt, m), by_tag in means.items():
    print(f"{fmt:4} {m:5}  " + "  ".join(f"{tag} {statistics.geometric_mean(v):.3f} ({min(v):.3f})"
                                         for tag, v in by_tag.items()))
