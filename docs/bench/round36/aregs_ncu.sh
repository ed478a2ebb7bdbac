#!/bin/bash
# Call 2 of round 36: the 128x192 tile with and without a_regs under Nsight Compute at 16384x2112x7168 (FP8, bf16 out):
# shared memory's throughput against the tensor pipe's.
K='regex:block_scaled_mm_ws'
for impl in gluon:block_n=192,sub_n=64 gluon:block_n=192,sub_n=64,a_regs=1; do
  echo "== $impl" >> $OUT/aregs_ncu.txt
  ncu --clock-control none -k "$K" --launch-skip 4 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --metrics sm__cycles_elapsed.avg,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum \
      python3 docs/bench/round29/long_k_ncu.py $impl 16384 2112 7168 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/aregs_ncu.txt
done
grep -E "^== |Duration|Elapsed Cycles|SM Frequency|L1/TEX Cache Throughput|Shared|gmma|wavefronts|inst_executed|highest-utilized" $OUT/aregs_ncu.txt
