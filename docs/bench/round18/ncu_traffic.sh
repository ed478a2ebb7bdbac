#!/bin/bash
# How ncu_traffic.txt was made: ncu_traffic.py under Nsight Compute, the Gluon GEMM and cuBLAS at two shapes.
cd "$(dirname "$0")"
METRICS=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
for shape in "4096 32768 512" "4096 7168 16384"; do
  for impl in gluon cublas; do
    echo "== $impl $shape"
    ncu --clock-control none -k regex:'block_scaled_mm_ws|nvjet|gemm|sm90' --launch-skip 2 --launch-count 1 \
        --metrics $METRICS python3 ncu_traffic.py $impl $shape 2>&1 | grep -v "Warning\|plan = \|==PROF==\|==WARNING=="
  done
done
