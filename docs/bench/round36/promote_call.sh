#!/bin/bash
# Call 5 of round 36: probe_variants.diff's tree, FP8: the shipped kernel, the same with no promotion, cuBLAS tensor-wise.
export PROBE_SET=promote PROBE_FMTS=fp8
time (PROBE_WARM=1 PROBE_JOBS=12 python3 docs/bench/round36/aregs_probe.py warm > $OUT/promote_warm.log 2>&1); echo "warm rc $?"; tail -3 $OUT/promote_warm.log
for i in 1 2; do
  timeout 200 python3 docs/bench/round36/aregs_probe.py run$i >> $OUT/promote.jsonl 2> $OUT/promote_err$i.log; echo "run$i rc $?"; tail -2 $OUT/promote_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/promote.jsonl | tee $OUT/promote.txt
