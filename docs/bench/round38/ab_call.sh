#!/bin/bash
# Round 38's calls: round 23's probe (cublas_ab.py: the Gluon GEMM on config_for's tile beside cuBLAS block-wise FP8
# or torch._int_mm, with a checksum of each output's bits) in BASE (df06b87's quantcore) and in TREE (the same with a
# diff of this folder applied), one process of each tag in turn, two rounds, 4096 and 16384 rows, each process under a
# 150 s timeout (a barrier waited for in vain hangs the kernel).
# Usage: BASE=<tree> TREE=<tree> OUT=<dir> TAGS="base:<env> x:<env> ..." bash docs/bench/round38/ab_call.sh
#   raw_ring:   TAGS="base: raw:QC_RAW_RING=1"
#   scale_warp: TAGS="base: prod:QC_PROD=1 fake:QC_PROD=1,QC_PFAKE=1"
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
start=$(date +%s)
for r in 1 2; do
  [ $(( $(date +%s) - start )) -gt 260 ] && break
  for tv in $TAGS; do
    tag=${tv%%:*}; vars=${tv#*:}
    tree=$TREE; [ $tag = base ] && tree=$BASE
    t0=$(date +%s)
    env ${vars//,/ } PROBE_MS=4096,16384 PYTHONPATH=$tree:$PYTHONPATH timeout 150 \
        python3 docs/bench/round23/cublas_ab.py $tag >> $OUT/ab.jsonl 2>> $OUT/ab.err
    rc=$?; echo "$tag round $r: rc $rc $(( $(date +%s) - t0 )) s"
    [ $rc = 124 ] && { echo "a process hung"; exit 1; }
  done
done
python3 docs/bench/round23/cublas_ab_table.py $OUT/ab.jsonl > $OUT/ab.txt; cat $OUT/ab.txt
