#!/bin/bash
# Round 35 call 5: warp stall reasons per issued instruction (Nsight Compute), preload_variants.diff's tree, INT8
# re-quantized at 4096x32768x512 and bias + re-quantized at 4096x4096x7168, QC_PRELOAD unset and 3. VARIANTS: a folder
# holding d0fdfdd's quantcore with preload_variants.diff applied.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
P=docs/bench/round32/short_k_ncu.py
export PYTHONPATH=${VARIANTS:-$PWD/.scratch/r35/variants}:$PYTHONPATH
for spec in "rq::4096 32768 512" "rq:3:4096 32768 512" "brq::4096 4096 7168" "brq:3:4096 4096 7168"; do
  epi=${spec%%:*}; rest=${spec#*:}; m=${rest%%:*}; shape=${rest#*:}
  echo "== int8 $epi QC_PRELOAD=${m:-unset} $shape" >> $OUT/stalls_ncu.txt
  env ${m:+QC_PRELOAD=$m} timeout 100 ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 \
      --metrics "gpu__time_duration.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 $P int8 $epi $shape 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/stalls_ncu.txt
  echo "ncu $spec rc $?"
done
python3 - $OUT/stalls_ncu.txt <<'PY'
import re, sys
blocks = open(sys.argv[1]).read().split("== ")[1:]
rows = {}
for b in blocks:
    head = b.splitlines()[0]
    for m in re.finditer(r"(\S+)\s+(\S+)?\s+([\d,.]+)\s*$", b, re.M):
        name = m.group(1)
        if name.startswith(("smsp__", "gpu__")):
            rows.setdefault(name.replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", ""), {})[head] = m.group(3)
heads = [b.splitlines()[0] for b in blocks]
print("metric".ljust(28) + "".join(h.split(" QC_")[1][:22].rjust(24) for h in heads))
for name, vals in rows.items():
    print(name[:28].ljust(28) + "".join(vals.get(h, "-").rjust(24) for h in heads))
PY
