#!/bin/bash
# Round 35 call 1: PRELOAD for re-quantized / bias outputs, loads mid-epilogue (2) or at its end (3), against HEAD.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
BASE=${BASE:-$PWD/.scratch/r35/base}
for spec in 2:4096 3:4096 2:16384; do
  m=${spec%%:*}; ms=${spec#*:}
  d=$OUT/p${m}_$ms; mkdir -p $d
  t0=$(date +%s)
  QC_PRELOAD=$m BASE=$BASE OUT=$d PROBE_MS=$ms timeout 200 bash docs/bench/round28/int8_codes.sh > $d/table.txt 2>&1
  echo "p$m $ms rc $? $(( $(date +%s) - t0 )) s"; tail -5 $d/table.txt
done
