#!/bin/bash
# Call 8 of round 36: probe_variants.diff's tree, FP8 and INT8: base, late (depth 22) and d12, two processes.
export PROBE_SET=late
(PROBE_WARM=1 PROBE_JOBS=12 python3 docs/bench/round36/aregs_probe.py warm > $OUT/late_warm.log 2>&1); echo "warm rc $?"; tail -3 $OUT/late_warm.log
for i in 1 2; do
  timeout 250 python3 docs/bench/round36/aregs_probe.py run$i >> $OUT/late.jsonl 2> $OUT/late_err$i.log; echo "run$i rc $?"; tail -2 $OUT/late_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/late.jsonl | tee $OUT/late.txt
