#!/bin/bash
# Calls 6 and 7 of round 36: probe_variants.diff's tree under Nsight Compute at 16384x4096x7168 (FP8, bf16 out): cycles,
# clock, instructions and the stall reasons per issued instruction of each IMPL of promote_ncu.py, into $OUT/NAME.txt and
# a table. Usage: OUT=<dir> bash promote_ncu.sh NAME IMPL...  (call 6: promote_ncu base d0 cublas cublas_tw;
# call 7: loads_ncu base d12)
name=$1; shift
for impl in "$@"; do
  echo "== $impl" >> $OUT/$name.txt
  timeout 120 ncu --clock-control none -k 'regex:block_scaled_mm_ws|nvjet|sm90' --launch-skip 4 --launch-count 1 \
      --metrics "gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 docs/bench/round36/promote_ncu.py $impl 16384 4096 7168 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/$name.txt
  echo "ncu $impl rc $?"
done
python3 - $OUT/$name.txt <<'PY' | tee $OUT/${name}_table.txt
import re, sys
blocks = open(sys.argv[1]).read().split("== ")[1:]
rows, heads = {}, []
for b in blocks:
    head = b.splitlines()[0].strip()
    heads.append(head)
    for m in re.finditer(r"^\s+(\S+)\s+(\S+\s+)?([\d,.]+)\s*$", b, re.M):
        name = m.group(1)
        if name.startswith(("smsp__", "gpu__", "sm__")):
            key = name.replace("smsp__average_warps_issue_stalled_", "stall ").replace("_per_issue_active.ratio", "")
            rows.setdefault(key, {})[head] = m.group(3)
print("metric".ljust(46) + "".join(h.rjust(14) for h in heads))
for name, vals in rows.items():
    if name.startswith("stall") and all(float(v.replace(",", "")) < 0.05 for v in vals.values()):
        continue
    print(name[:46].ljust(46) + "".join(vals.get(h, "-").rjust(14) for h in heads))
PY
