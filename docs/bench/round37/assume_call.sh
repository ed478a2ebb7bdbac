#!/bin/bash
# Round 37's epilogue A/B: round 28's probe (re-quantized and bias + re-quantized outputs over each tree's plain GEMM)
# in the tree unpacked under BASE (0440f49's quantcore) and in this one, alternately, 4096 and 16384 rows.
# Usage: BASE=<tree> OUT=<dir> bash docs/bench/round37/assume_call.sh NAME
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/$1
OUT=$OUT/$1 PROBE_MS=${PROBE_MS:-4096,16384} timeout 500 bash docs/bench/round28/int8_codes.sh > $OUT/$1/table.txt 2>&1
echo "probe rc $? $(( $(date +%s) - t0 )) s"; tail -8 $OUT/$1/table.txt
