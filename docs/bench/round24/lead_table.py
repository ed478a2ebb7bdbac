"""lead_kb_probe.py's or stagger_probe.py's JSON lines -> a table: per case the time of each variant (lead_kb, or
stagger off / on), the plain GEMM's first variant against cuBLAS / _int_mm; then per format, rows and epilogue the
geometric mean of time / the first variant's, and of time / the plain GEMM's first variant where the run has it (runs
of the same case averaged in the log domain).

Usage: python3 docs/bench/round24/lead_table.py out.jsonl"""
import json
import math
import sys
from collections import defaultdict

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = defaultdict(list)
for r in rows:
    by[(r["fmt"], r["M"], r["N"], r["K"], r["epilogue"])].append(r)
leads = rows[0]["leads"]


def gmean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


print(rows[0]["device"], rows[0]["versions"])
label = "stagger" if leads == [0, 1] else "lead"  # stagger_probe.py's off / on, lead_kb_probe.py's K blocks
print(f"{'fmt':4} {'M':>6} {'N':>6} {'K':>6} {'epilogue':13} {'tile':8} " +
      " ".join(f"{label + str(x):>8}" for x in leads) + "  base   bits")
times = {}
for key, rs in by.items():
    us = [gmean([r["us"][i] for r in rs]) for i in range(len(leads))]
    times[key] = us
    base = [r["base_us"] for r in rs if r["base_us"]]
    b = f"{gmean(base) / us[0]:6.3f}" if base else "      "
    print(f"{key[0]:4} {key[1]:6} {key[2]:6} {key[3]:6} {key[4]:13} {rs[0]['tile']:8} " +
          " ".join(f"{u:8.1f}" for u in us) + f"  {b} {'yes' if all(r['same_bits'] for r in rs) else 'NO'}")
print(f"\ntime / {label} 0's (geomean over shapes); [time / plain at {label} 0]; plain also base / time")
groups = defaultdict(list)
for (fmt, M, N, K, e), us in times.items():
    groups[(fmt, M, e)].append((N, K, us))
for (fmt, M, e), items in groups.items():
    rel = [gmean([us[i] / us[0] for _, _, us in items]) for i in range(len(leads))]
    line = f"{fmt:4} {M:6} {e:13} " + " ".join(f"{x:6.3f}" for x in rel)
    if all((fmt, M, N, K, "plain") in times for N, K, _ in items):
        over = [gmean([us[i] / times[(fmt, M, N, K, "plain")][0] for N, K, us in items]) for i in range(len(leads))]
        line += "  [" + " ".join(f"{x:6.3f}" for x in over) + "]"
    if e == "plain":
        base = []
        for i in range(len(leads)):
            base.append(gmean([gmean([r["base_us"] for r in by[(fmt, M, N, K, e)]]) / us[i] for N, K, us in items]))
        line += "  vs base " + " ".join(f"{x:6.3f}" for x in base)
    print(line)
