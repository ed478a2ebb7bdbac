#!/bin/bash
# How round 28's int8_codes.txt was made on the H100: int8_codes_probe.py in the tree unpacked under BASE (round 27's
# last commit, 41e5d2b: `git archive 41e5d2b quantcore | tar -x -C $BASE`) and in this one, alternately, two pairs of
# processes, every case compiled first by --warm in 12 processes.
# Usage: BASE=/path/to/old/tree OUT=dir bash docs/bench/round28/int8_codes.sh
cd "$(dirname "$0")/../../.."
R=docs/bench/round24
for i in 0 1 2 3 4 5; do
  PYTHONPATH=$BASE:$PYTHONPATH:$R python3 docs/bench/round28/int8_codes_probe.py --warm $i 6 &
  PYTHONPATH=$PYTHONPATH:$R python3 docs/bench/round28/int8_codes_probe.py --warm $i 6 &
done
wait
for i in 1 2; do
  PYTHONPATH=$BASE:$PYTHONPATH:$R python3 docs/bench/round28/int8_codes_probe.py base >> $OUT/int8_codes.jsonl
  PYTHONPATH=$PYTHONPATH:$R python3 docs/bench/round28/int8_codes_probe.py new >> $OUT/int8_codes.jsonl
done
python3 docs/bench/round28/int8_codes_probe.py --table $OUT/int8_codes.jsonl
