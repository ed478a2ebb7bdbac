#!/bin/bash
# How round 20's host_probe.txt was made: host_probe.py run by PAIRS pairs of processes, the kept plans replayed
# in Python (QUANTCORE_NATIVE=0, round 19's path) and natively, alternately; the last native one with GPU times.
# The native extension is built first (its own process). Usage: OUT=dir [PAIRS=3] bash host_probe.sh
cd "$(dirname "$0")/../../.."
PAIRS=${PAIRS:-3}
python3 -c "from quantcore.backends import native; assert native.module() is not None, native.reason()"
for i in $(seq 1 $PAIRS); do
  QUANTCORE_NATIVE=0 python3 docs/bench/round20/host_probe.py python >> $OUT/host_probe.jsonl
  extra=""; [ $i = $PAIRS ] && extra=gpu
  QUANTCORE_NATIVE=1 python3 docs/bench/round20/host_probe.py native $extra >> $OUT/host_probe.jsonl
done
python3 docs/bench/round17/host_probe_table.py $OUT/host_probe.jsonl
