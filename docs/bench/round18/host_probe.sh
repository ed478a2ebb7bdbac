#!/bin/bash
# How round 18's host_probe.txt was made: round 17's probe (docs/bench/round17/host_probe.py) and the custom
# op floor (custom_op_floor.py) run by three pairs of processes, round 17's last commit (ad8d6f9's quantcore,
# unpacked under BASE) and this round's, alternately; the last with round 17's breakdown ("parts").
# Usage: BASE=/path/to/old/tree OUT=dir [PAIRS=3] bash host_probe.sh
cd "$(dirname "$0")/../../.."
PAIRS=${PAIRS:-3}
for i in $(seq 1 $PAIRS); do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$PWD; fi
    extra=""; [ $i = 3 ] && [ $PAIRS = 3 ] && [ $v = new ] && extra=parts
    PYTHONPATH=$P:$PYTHONPATH python3 docs/bench/round17/host_probe.py $v $extra >> $OUT/host_probe.jsonl
    PYTHONPATH=$P:$PYTHONPATH python3 docs/bench/round18/custom_op_floor.py $v >> $OUT/host_probe.jsonl
  done
done
python3 docs/bench/round17/host_probe_table.py $OUT/host_probe.jsonl
