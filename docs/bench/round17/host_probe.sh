#!/bin/bash
# How host_probe.txt was made: the probe run by three pairs of processes, HEAD before this round (3f89f4e's
# quantcore, unpacked under BASE) and this round's, alternately; the last with the breakdown ("parts")
# and each case's GPU time. Usage: BASE=/path/to/old/tree OUT=dir bash host_probe.sh
cd "$(dirname "$0")/../../.."
for i in 1 2 3; do
  for v in base new; do
    if [ $v = base ]; then P=$BASE; else P=$PWD; fi
    extra=""; [ $i = 3 ] && [ $v = new ] && extra=parts
    PYTHONPATH=$P python3 docs/bench/round17/host_probe.py $v $extra >> $OUT/host_probe.jsonl
  done
done
python3 docs/bench/round17/host_probe_table.py $OUT/host_probe.jsonl
