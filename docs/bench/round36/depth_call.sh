#!/bin/bash
# Call 4 of round 36: probe_variants.diff's tree, the 128x192 tile keeping two or three wgmmas a consumer in flight.
export PROBE_SET=depth
time (PROBE_WARM=1 PROBE_JOBS=12 python3 docs/bench/round36/aregs_probe.py warm > $OUT/depth_warm.log 2>&1); echo "warm rc $?"; tail -3 $OUT/depth_warm.log
for i in 1 2; do
  timeout 200 python3 docs/bench/round36/aregs_probe.py run$i >> $OUT/depth.jsonl 2> $OUT/depth_err$i.log; echo "run$i rc $?"; tail -2 $OUT/depth_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/depth.jsonl | tee $OUT/depth.txt
