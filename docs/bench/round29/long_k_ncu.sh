#!/bin/bash
# How long_k_ncu*.txt were made: long_k_ncu.py under Nsight Compute, the Gluon GEMM and cuBLAS at 4096x7168x16384.
# Usage: OUT=dir bash long_k_ncu.sh
cd "$(dirname "$0")/../../.."
K='regex:block_scaled_mm_ws|nvjet|sm90'
ncu --query-metrics --chip gh100 2>/dev/null | grep -i "gmma\|pipe_tensor" > $OUT/long_k_metrics.txt
for impl in gluon cublas; do
  echo "== $impl" >> $OUT/long_k_ncu.txt
  ncu --clock-control none -k "$K" --launch-skip 4 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
      --section WarpStateStats --section LaunchStats --section Occupancy \
      python3 docs/bench/round29/long_k_ncu.py $impl 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/long_k_ncu.txt
done
ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --section WarpStateStats \
    --section SourceCounters --page source --print-source sass --csv python3 docs/bench/round29/long_k_ncu.py gluon \
    > $OUT/long_k_source.csv 2> $OUT/long_k_source.err
python3 docs/bench/round9/ncu_stalls.py $OUT/long_k_source.csv 60 > $OUT/long_k_stalls.txt
