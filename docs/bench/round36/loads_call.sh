#!/bin/bash
# Call 7 of round 36: probe_variants.diff's tree (with depth 12), FP8: the probe's promote set, then Nsight Compute on
# base and d12 at 16384x4096x7168 as promote_ncu.sh measures.
export PROBE_SET=promote PROBE_FMTS=fp8
(PROBE_WARM=1 PROBE_JOBS=12 python3 docs/bench/round36/aregs_probe.py warm > $OUT/loads_warm.log 2>&1); echo "warm rc $?"
for i in 1 2; do
  timeout 200 python3 docs/bench/round36/aregs_probe.py run$i >> $OUT/loads.jsonl 2> $OUT/loads_err$i.log; echo "run$i rc $?"; tail -2 $OUT/loads_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/loads.jsonl | tee $OUT/loads.txt
for impl in base d12; do
  echo "== $impl" >> $OUT/loads_ncu.txt
  timeout 120 ncu --clock-control none -k 'regex:block_scaled_mm_ws' --launch-skip 4 --launch-count 1 \
      --metrics "gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 docs/bench/round36/promote_ncu.py $impl 16384 4096 7168 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/loads_ncu.txt
  echo "ncu $impl rc $?"
done
grep -E "^== |gpu__time|cycles_elapsed|inst_executed|long_score|barrier|dispatch|_wait|gmma" $OUT/loads_ncu.txt
