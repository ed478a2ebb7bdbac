#!/bin/bash
# cublas_ab.py in the tree unpacked under BASE and in this one, alternately, PAIRS pairs of processes (the first
# pair also compiles), then the table (cublas_ab_table.py).
# Usage: BASE=/path/to/old/tree OUT=dir [PAIRS=2] [PROBE_MS=512,4096,16384] [PROBE_FMTS=fp8,int8] bash cublas_ab.sh
cd "$(dirname "$0")/../../.."
for i in $(seq 1 ${PAIRS:-2}); do
  PYTHONPATH=$BASE:$PYTHONPATH python3 docs/bench/round23/cublas_ab.py base >> $OUT/cublas_ab.jsonl
  PYTHONPATH=$PWD:$PYTHONPATH python3 docs/bench/round23/cublas_ab.py new >> $OUT/cublas_ab.jsonl
done
python3 docs/bench/round23/cublas_ab_table.py $OUT/cublas_ab.jsonl
