#!/bin/bash
# Round 35 call 2. (A) Nsight Compute warp states, HEAD's epilogue kernels against PRELOAD after the stores (3);
# (B) the plain GEMM: PRELOAD after the main loop (1, shipped) against after the stores (3), beside cuBLAS/_int_mm.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
P=docs/bench/round32/short_k_ncu.py
for spec in "rq::4096 32768 512" "rq:3:4096 32768 512" "brq::4096 4096 7168" "brq:3:4096 4096 7168"; do
  epi=${spec%%:*}; rest=${spec#*:}; m=${rest%%:*}; shape=${rest#*:}
  echo "== int8 $epi QC_PRELOAD=${m:-unset} $shape" >> $OUT/icache_ncu.txt
  env ${m:+QC_PRELOAD=$m} timeout 100 ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      python3 $P int8 $epi $shape 2>&1 | grep -v "==PROF==\|==WARNING==\|Warning" >> $OUT/icache_ncu.txt
  echo "ncu $spec rc $?"
done
grep -E "^== |Duration|No Instruction|Warp Cycles Per Issued|Issued Warp Per Scheduler|Stall " $OUT/icache_ncu.txt
t0=$(date +%s)
export PROBE_MS=4096,16384
for r in 1 2; do
  for m in 1 3; do
    QC_PRELOAD_PLAIN=$m python3 docs/bench/round23/cublas_ab.py p$m >> $OUT/plain_ab.jsonl 2>> $OUT/plain_ab.err
    echo "p$m round $r: $(( $(date +%s) - t0 )) s"
  done
done
python3 docs/bench/round23/cublas_ab_table.py $OUT/plain_ab.jsonl > $OUT/plain_ab.txt; cat $OUT/plain_ab.txt
