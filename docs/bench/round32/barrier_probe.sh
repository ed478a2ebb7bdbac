#!/bin/bash
# Round 32: round 23's probe (docs/bench/round23/cublas_ab.py: the plain Gluon GEMM timed interleaved with cuBLAS
# block-wise FP8 or torch._int_mm) in processes whose Triton drops some of the consumers' warpgroup barriers from the
# PTX (barrier_patch.py: none, wait, both), each variant with its own kernel cache: compiled first by one process of
# each in parallel (output dropped), then PAIRS rounds of one process of each, alternating.
# Usage: OUT=dir [PAIRS=2] [PROBE_MS=4096,16384] [PROBE_FMTS=fp8,int8] bash docs/bench/round32/barrier_probe.sh
cd "$(dirname "$0")/../../.." || exit
R=docs/bench/round32
export PROBE_MS=${PROBE_MS:-4096,16384}
run() {
  BARRIER_PATCH=$1 TRITON_CACHE_DIR=/tmp/barrier_cache_$1 PYTHONPATH=$PWD/$R:$PYTHONPATH python3 -c "
import runpy, sys
import barrier_patch
barrier_patch.install()
sys.argv = ['cublas_ab.py', '$1']
runpy.run_path('docs/bench/round23/cublas_ab.py', run_name='__main__')"
}
for v in none wait both; do PROBE_MS=${PROBE_MS%%,*} run $v > /dev/null 2> $OUT/barrier_warm_$v.err & done
wait
for i in $(seq 1 ${PAIRS:-2}); do
  for v in none wait both; do run $v >> $OUT/barrier_probe.jsonl; done
done
python3 docs/bench/round23/cublas_ab_table.py $OUT/barrier_probe.jsonl
