#!/bin/bash
# How round 30's run files were made on the H100 (OUT=dir; run from the repo root with QUANTCORE_NATIVE=0).
set -e
cd "$(dirname "$0")/../../.."
R=docs/bench/round30
# as_smem_ab.txt / .jsonl: round 23's cublas_ab.py in HEAD's tree (base, e.g. `git archive d8058cb quantcore`) and in
# this tree with as_smem.diff applied (the activation scales copied into each ring slot by the producer with cp.async
# tracked by the slot's ready barrier, the consumers reading them from shared memory), two rounds, 4096 and 16384 rows.
for r in 1 2; do
  PYTHONPATH=$BASE:$PYTHONPATH PROBE_MS=4096,16384 python3 docs/bench/round23/cublas_ab.py base >> $OUT/as_smem_ab.jsonl
  PROBE_MS=4096,16384 python3 docs/bench/round23/cublas_ab.py as_smem >> $OUT/as_smem_ab.jsonl
done
python3 docs/bench/round29/yield_probe.py --table $OUT/as_smem_ab.jsonl > $OUT/as_smem_ab.txt
# The CUDA C++ probes: cubins built beside the sources (here or on the GPU machine) by nvcc 13.0.
F="-arch=sm_90a -std=c++17 -cubin"
nvcc $F -DCLUSTER=0 -o $R/mc_gemm_v13gcwmc0.cubin $R/mc_gemm.cu
nvcc $F -DCLUSTER=1 -o $R/mc_gemm_v13gcwmc1.cubin $R/mc_gemm.cu
nvcc $F -DCLUSTER=2 -o $R/mc_gemm_v13gcwm.cubin $R/mc_gemm.cu
nvcc $F -o $R/wide_c0.cubin $R/mc_wide.cu
nvcc $F -DMULTICAST -o $R/wide_mc.cubin $R/mc_wide.cu
# mc_final.txt: every variant beside Gluon and cuBLAS, one process.
(cd $R && MC_WIDE=wide_c0,wide_mc MC_CUBINS=mc_gemm_v13gcwmc0,mc_gemm_v13gcwmc1,mc_gemm_v13gcwm \
  python3 -W ignore mc.py 4096,16384 > $OUT/mc_final.txt)
# (The kept sources compile to the SASS of the cubins measured; mc_gemm.cu keeps only the final version's code.)
# The Nsight Compute files were made on earlier versions of mc_gemm.cu (their sources not kept; each version's
# change is in docs/performance.md, Round 30): mc_ncu_long_k.txt and mc_v4_stalls.txt on v4 (clusters sharing A,
# st.global epilogue, scale pointers without __restrict__) and v5c1 (no multicast, scales a step ahead) beside the
# Gluon 128x128 kernel; mc_ncu_k512.txt and mc_k512_stalls.txt on v8 without multicast at 4096x32768x512;
# mc_ncu_bytes.txt on v9 (TMA-stored output) with and without multicast; mc_c0_stalls.txt on v10 (Gluon's walk,
# plain launch) and gluon128_stalls.txt on the Gluon 128x128 kernel, both at 4096x7168x16384. The commands, with
# S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats":
#   ncu --clock-control none -k regex:mc_gemm --launch-skip 4 --launch-count 1 $S python3 $R/ncu_mc.py <cubin> [M N K]
#   ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 $S \
#       python3 docs/bench/round29/long_k_ncu.py gluon:block_n=128 [M N K]
#   (mc_ncu_bytes.txt adds --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,
#    sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_read.sum,
#    lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum)
#   the *_stalls.txt: --section WarpStateStats --section SourceCounters --page source --print-source sass --csv,
#   then python3 docs/bench/round9/ncu_stalls.py <csv> 30
