"""Table of aregs_probe.py's JSON lines: per case each variant's µs (median over the runs) and the baseline's time
over it, whether its bits equal base's; then per format and M the geometric mean (lowest) of baseline / variant."""
import json
import math
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
by = defaultdict(list)
for r in rows:
    by[(r["fmt"], r["m"], r["n"], r["k"], r["variant"])].append(r)
names = list(dict.fromkeys(r["variant"] for r in rows))
ratios = defaultdict(list)
print(f"{'fmt':5s} {'M':>6s} {'N':>6s} {'K':>6s}  " + "  ".join(f"{v:>20s}" for v in names))
for key in dict.fromkeys((r["fmt"], r["m"], r["n"], r["k"]) for r in rows):
    cells = []
    base_bits = {r["bits"] for r in by[key + ("base",)]}
    for v in names:
        rs = by.get(key + (v,))
        if not rs:
            cells.append(f"{'':>20s}")
            continue
        us = statistics.median(r["us"] for r in rs)
        ratio = statistics.median(r["base_us"] / r["us"] for r in rs)
        ratios[(key[0], key[1], v)].append(ratio)
        same = "=" if {r["bits"] for r in rs} == base_bits else "!"
        cells.append(f"{us:9.1f} {ratio:6.3f}{same}".rjust(20))
    print(f"{key[0]:5s} {key[1]:6d} {key[2]:6d} {key[3]:6d}  " + "  ".join(cells))
print("\nbaseline time / variant time over the shapes: geometric mean (lowest); = same bits as base, ! not")
for (fmt, m, v), rs in ratios.items():
    print(f"{fmt:5s} {m:6d} {v:6s} {math.exp(sum(map(math.log, rs)) / len(rs)):.3f} ({min(rs):.3f}) over {len(rs)}")
