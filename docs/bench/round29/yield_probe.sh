#!/bin/bash
# yield_probe.py once per variant in turn, PAIRS rounds (the first also compiles), then the table.
# Usage: OUT=dir [PAIRS=1] [VARIANTS="none dg all alt"] [PROBE_MS=...] [PROBE_FMTS=...] bash yield_probe.sh
cd "$(dirname "$0")/../../.."
for i in $(seq 1 ${PAIRS:-1}); do
  for v in ${VARIANTS:-none dg all alt}; do
    python3 docs/bench/round29/yield_probe.py $v >> $OUT/yield_probe.jsonl 2>> $OUT/yield_probe.err
  done
done
python3 docs/bench/round29/yield_probe.py --table $OUT/yield_probe.jsonl | tee $OUT/yield_probe.txt
