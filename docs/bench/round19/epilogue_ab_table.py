"""The table of epilogue_ab.py's JSON lines: per case and tree, the median over processes of the time and
of the time over the plain GEMM timed beside it; per format and epilogue the geometric mean of those
ratios over the six shapes; and whether the trees' outputs had the same checksum."""
import json
import math
import statistics
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
by = defaultdict(list)
for r in rows:
    by[(r["fmt"], r["N"], r["K"], r["epilogue"], r["tag"])].append(r)
tags = sorted({r["tag"] for r in rows})
keys = list(dict.fromkeys((r["fmt"], r["N"], r["K"], r["epilogue"]) for r in rows))  # in the order first run
print(rows[0]["device"], rows[0]["versions"])
print("fmt  N     K      epilogue           " + "  ".join(f"{t:>5s} us  /plain" for t in tags) + "  same bits")
ratios = defaultdict(list)
for k in keys:
    cells, sums = [], set()
    for t in tags:
        rs = by.get(k + (t,), [])
        us = statistics.median(r["us"] for r in rs)
        ratio = statistics.median(r["us"] / r["plain_us"] for r in rs)
        ratios[(k[0], k[3], t)].append(ratio)
        cells.append(f"{us:8.1f}  {ratio:5.3f}")
        sums |= {r["checksum"] for r in rs}
    print(f"{k[0]:4s} {k[1]:5d} {k[2]:5d}  {k[3]:18s} " + "  ".join(cells) + f"  {'yes' if len(sums) == 1 else 'NO'}")
print("\nGeomean over the six shapes of time / the plain GEMM's")
for fmt in sorted({k[0] for k in keys}):
    for e in dict.fromkeys(k[3] for k in keys):
        vals = [ratios[(fmt, e, t)] for t in tags]
        means = (math.exp(sum(map(math.log, v)) / len(v)) for v in vals)
        print(f"{fmt:4s} {e:18s} " + "  ".join(f"{t} {m:.3f}" for t, m in zip(tags, means)))
