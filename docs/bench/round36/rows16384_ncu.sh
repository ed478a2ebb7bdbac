#!/bin/bash
# Call 3 of round 36: the shipped Gluon GEMM (config_for's tile) and cuBLAS block-wise under Nsight Compute at the two
# long-K shapes of 16384 rows (FP8, bf16 out): L2 and DRAM traffic beside the tensor pipe.
for shape in "16384 4096 7168" "16384 7168 16384"; do
  for impl in gluon cublas; do
    echo "== $impl $shape" >> $OUT/rows16384_ncu.txt
    ncu --clock-control none -k 'regex:block_scaled_mm_ws|nvjet|sm90' --launch-skip 4 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,sm__cycles_elapsed.avg \
        python3 docs/bench/round29/long_k_ncu.py $impl $shape 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/rows16384_ncu.txt
  done
done
grep -E "^== |Duration|Elapsed Cycles|SM Frequency|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|highest-utilized|dram__bytes|hit_rate|sectors_srcunit" $OUT/rows16384_ncu.txt
