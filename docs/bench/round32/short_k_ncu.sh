#!/bin/bash
# How short_k_ncu*.txt were made: short_k_ncu.py under Nsight Compute (the fifth launch of each), FP8 and INT8 at
# 4096x32768x512, the plain GEMM and its epilogues, stagger as config_for sets it and off; then the SASS stall samples
# of FP8 bias + re-quantized (round 9's ncu_stalls.py).
# Usage: OUT=dir bash docs/bench/round32/short_k_ncu.sh
cd "$(dirname "$0")/../../.." || exit
P=docs/bench/round32/short_k_ncu.py
for fmt in fp8 int8; do
  for epi in plain bias rq brq brq:stagger=0; do
    echo "== $fmt $epi" >> $OUT/short_k_ncu.txt
    ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
        --section WarpStateStats python3 $P $fmt $epi 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" \
        >> $OUT/short_k_ncu.txt
  done
done
for epi in plain brq; do
  ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --section WarpStateStats \
      --section SourceCounters --page source --print-source sass --csv python3 $P fp8 $epi \
      > $OUT/short_k_source_$epi.csv 2> $OUT/short_k_source_$epi.err
  python3 docs/bench/round9/ncu_stalls.py $OUT/short_k_source_$epi.csv 60 > $OUT/short_k_stalls_$epi.txt
done
