"""Round 39: per format and row count, the geometric mean (range) over the six shapes of one tag's Gluon time over
another's, from round 23's probe output (the median of each tag's processes). Usage: ptxas_ratio.py ab.jsonl A B"""
import collections
import json
import math
import statistics
import sys

times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    times[r["tag"], r["fmt"], r["m"], r["n"], r["k"]].append(r["us"])
a, b = sys.argv[2], sys.argv[3]
groups = collections.defaultdict(list)
for (tag, fmt, m, n, k), us in sorted(times.items()):
    if tag == b:
        groups[fmt, m].append(statistics.median(us) / statistics.median(times[a, fmt, m, n, k]))
print(f"Gluon time, {b} over {a}: geometric mean (lowest, highest) over the six shapes")
for (fmt, m), rs in groups.items():
    gm = math.exp(sum(map(math.log, rs)) / len(rs))
    print(f"{fmt:5} {m:6}  {gm:.3f} ({min(rs):.3f}, {max(rs):.3f})")
