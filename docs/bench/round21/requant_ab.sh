#!/bin/bash
# How round 21's requant_ab*.txt were made: requant_ab.py in the tree unpacked under BASE (round 20's last
# commit) and in this one, alternately, PAIRS pairs of processes, each tree's kernels compiled first.
# Usage: BASE=/path/to/old/tree OUT=dir [PAIRS=2] [PROBE_M=4096] [PROBE=docs/bench/round22/requant_ab.py] bash
# requant_ab.sh (round 22 ran its own probe through it, against round 21's last commit)
cd "$(dirname "$0")/../../.."
PAIRS=${PAIRS:-2}
PROBE=${PROBE:-docs/bench/round21/requant_ab.py}
for v in base new; do
  if [ $v = base ]; then P=$BASE; else P=$PWD; fi
  PYTHONPATH=$P:$PYTHONPATH python3 $PROBE --parallel-warm
done
for i in $(seq 1 $PAIRS); do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$PWD; fi
    PYTHONPATH=$P:$PYTHONPATH python3 $PROBE $v >> $OUT/requant_ab.jsonl
  done
done
python3 docs/bench/round19/epilogue_ab_table.py $OUT/requant_ab.jsonl
