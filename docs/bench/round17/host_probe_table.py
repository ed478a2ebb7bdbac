"""host17.jsonl -> per case, each process's median (min) per version, and the median over processes."""
import json, sys, collections, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = collections.defaultdict(lambda: collections.defaultdict(list))
for r in rows:
    if "case" in r:
        cases[r["case"]][r["tag"]].append((r["median_us"], r["min_us"]))
        if "gpu_us" in r:
            cases[r["case"]]["gpu"] = [(r["gpu_us"], r["gpu_us"])]
for c, d in cases.items():
    cells = []
    for t, v in d.items():
        cells.append(f"{t}: med {statistics.median(m for m, _ in v):5.1f} best {min(n for _, n in v):5.1f} [" +
                     " ".join(f"{m:.1f}" for m, _ in v) + "]")
    print(f"{c:38s}", "  ".join(cells))
for r in rows:
    if "part" in r:
        print(f"  {r['part']:60s} {r['us']}")
