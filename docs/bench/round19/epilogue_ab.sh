#!/bin/bash
# How round 19's epilogue_ab.txt was made: epilogue_ab.py in the tree unpacked under BASE (round 18's last
# commit) and in this one, alternately, PAIRS pairs of processes, each tree's kernels compiled first.
# Usage: BASE=/path/to/old/tree OUT=dir [PAIRS=2] bash epilogue_ab.sh
cd "$(dirname "$0")/../../.."
PAIRS=${PAIRS:-2}
for v in base new; do
  if [ $v = base ]; then P=$BASE; else P=$PWD; fi
  PYTHONPATH=$P:$PYTHONPATH python3 docs/bench/round19/epilogue_ab.py --parallel-warm
done
for i in $(seq 1 $PAIRS); do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$PWD; fi
    PYTHONPATH=$P:$PYTHONPATH python3 docs/bench/round19/epilogue_ab.py $v >> $OUT/epilogue_ab.jsonl
  done
done
python3 docs/bench/round19/epilogue_ab_table.py $OUT/epilogue_ab.jsonl
