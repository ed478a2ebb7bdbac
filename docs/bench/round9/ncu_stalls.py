"""Round-9 helper: warp stall samples of one kernel from ncu's per-instruction CSV, by reason and at the
most sampled SASS instructions (what round9/gluon_ncu_stalls.txt shows for the plain and the GELU Gluon GEMM).

    ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --section SourceCounters \
        --page source --print-source sass --csv python3 docs/bench/round9/gluon_ncu.py gelu > gelu.csv
    python3 docs/bench/round9/ncu_stalls.py gelu.csv 12
"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
header, data = rows[start], [r for r in rows[start + 1:] if len(r) >= len(rows[start])]
column = {h: j for j, h in enumerate(header)}
# Per reason: samples of warps stalled for it ("stall_x"), and of those the ones where no warp of the
# scheduler issued ("stall_x (Not Issued)"), a subset: shares are of the first kind.
reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
SAMPLES = "Warp Stall Sampling (All Samples)"


def value(row, name):
    try:
        return float(row[column[name]] or 0)
    except ValueError:
        return 0.0


totals = collections.Counter({h: sum(value(r, h) for r in data) for h in reasons})
everything = sum(totals.values())
print("total samples", everything)
for h, v in totals.most_common(12):
    print(f"  {h:30s} {v / everything:6.1%}")
for r in sorted(data, key=lambda r: -value(r, SAMPLES))[:int(sys.argv[2]) if len(sys.argv) > 2 else 15]:
    top = sorted(((value(r, h), h) for h in reasons), reverse=True)[:3]
    print(r[0], r[1][:60].ljust(60), r[column[SAMPLES]], [(h[6:], int(v)) for v, h in top])
