#!/bin/bash
# Round 23's probe (cublas_ab.py) in several trees: per round one process of each tree in turn, tagged, until BUDGET
# seconds have passed; then round 23's table over them all. Run from the repository root.
# Usage: OUT=dir TAGS="base:/tree d1:/tree ..." [ROUNDS=2] [BUDGET=470] [PROBE_MS=4096,16384] bash variants_ab.sh
start=$(date +%s)
for r in $(seq 1 ${ROUNDS:-2}); do
  for tv in $TAGS; do
    tag=${tv%%:*}; tree=${tv#*:}
    if [ $(( $(date +%s) - start )) -gt ${BUDGET:-470} ]; then echo "time budget reached before $tag round $r"; break 2; fi
    t0=$(date +%s)
    PYTHONPATH=$tree:$PYTHONPATH python3 docs/bench/round23/cublas_ab.py $tag >> $OUT/ab.jsonl 2>> $OUT/ab.err
    echo "$tag round $r: $(( $(date +%s) - t0 )) s"
  done
done
python3 docs/bench/round23/cublas_ab_table.py $OUT/ab.jsonl > $OUT/ab.txt; cat $OUT/ab.txt
