#!/bin/bash
# Round 37's probe calls: every variant compiled first, then two timed processes of shift_probe.py, then the table.
# Usage: [PROBE_FMTS=fp8] OUT=<dir> bash docs/bench/round37/shift_call.sh NAME
name=$1
d=docs/bench/round37
(PROBE_WARM=1 PROBE_JOBS=12 python3 $d/shift_probe.py warm > $OUT/${name}_warm.log 2>&1); echo "warm rc $?"
for i in 1 2; do
  timeout 250 python3 $d/shift_probe.py run$i >> $OUT/$name.jsonl 2> $OUT/${name}_err$i.log
  echo "run$i rc $?"; tail -2 $OUT/${name}_err$i.log
done
python3 docs/bench/round36/aregs_table.py $OUT/$name.jsonl | tee $OUT/$name.txt
