#!/bin/bash
# Call 9 of round 36: probe_variants.diff's tree, FP8 and INT8: base, ahead (depth 32) and d12, two processes.
export PROBE_SET=ahead
(PROBE_WARM=1 PROBE_JOBS=12 python3 docs/bench/round36/aregs_probe.py warm > $OUT/ahead_warm.log 2>&1); echo "warm rc $?"; tail -3 $OUT/ahead_warm.log
for i in 1 2; do
  timeout 250 python3 docs/bench/round36/aregs_probe.py run$i >> $OUT/ahead.jsonl 2> $OUT/ahead_err$i.log; echo "run$i rc $?"; tail -2 $OUT/ahead_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/ahead.jsonl | tee $OUT/ahead.txt
