#!/bin/bash
# How round 19's quant_ops_ab.txt was made: quant_ops_ab.py in the tree unpacked under BASE (round 18's last
# commit) and in this one, alternately, PAIRS pairs of processes (quant_ops_ab_cupy.txt: PROBE_BACKEND=cupy,
# NAME=quant_ops_ab_cupy).
# Usage: BASE=/path/to/old/tree OUT=dir [PAIRS=3] [NAME=quant_ops_ab] bash quant_ops_ab.sh
cd "$(dirname "$0")/../../.."
for i in $(seq 1 ${PAIRS:-3}); do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$PWD; fi
    PYTHONPATH=$P:$PYTHONPATH python3 docs/bench/round19/quant_ops_ab.py $v >> $OUT/${NAME:-quant_ops_ab}.jsonl
  done
done
python3 - $OUT/${NAME:-quant_ops_ab}.jsonl <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(rows[0]["device"], rows[0]["versions"])
print("op              fmt   base us  /copy    new us  /copy   same bits")
for op in dict.fromkeys(r["op"] for r in rows):
    for fmt in ("fp8", "int8"):
        cell = {}
        for tag in ("base", "new"):
            rs = [r for r in rows if (r["op"], r["fmt"], r["tag"]) == (op, fmt, tag)]
            cell[tag] = (statistics.median(r["us"] for r in rs), statistics.median(r["of_copy"] for r in rs))
        same = len({r["checksum"] for r in rows if (r["op"], r["fmt"]) == (op, fmt)}) == 1
        print(f"{op:15s} {fmt:4s} " + "  ".join(f"{u:8.1f}  {c:5.3f}" for u, c in cell.values()) + f"   {'yes' if same else 'NO'}")
PY
