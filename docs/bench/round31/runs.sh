#!/bin/bash
# How round 31's run files were made on the H100 (OUT=dir; run from the repo root with QUANTCORE_NATIVE=0 and
# PYTHONPATH holding the repo root). BASE: round 30's last commit's library, `git archive eafa708 quantcore | tar -x
# -C $BASE`; this tree holds the scale and its reciprocal without IEEE division's range check (`quant.block_scale`,
# `quant.reciprocal`).
cd "$(dirname "$0")/../../.." || exit
# gpu_division.txt: the division tests, the two exhaustive ones new.
python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_quantize_division.py > $OUT/gpu_division.txt 2>&1
# requant_ab.txt / .jsonl: round 28's probe, both trees alternately, two pairs of processes (the script names its
# output int8_codes.jsonl).
BASE=$BASE OUT=$OUT PROBE_MS=512,4096,16384 bash docs/bench/round28/int8_codes.sh > $OUT/requant_ab.txt
mv $OUT/int8_codes.jsonl $OUT/requant_ab.jsonl
# quant_ops_ab.txt / .jsonl: round 19's quantizer probe, both trees alternately, two pairs of processes.
BASE=$BASE OUT=$OUT PAIRS=2 bash docs/bench/round19/quant_ops_ab.sh > $OUT/quant_ops_ab.txt
# gpu_suite_cut.txt: the GPU suite but the native extension's tests (QUANTCORE_NATIVE=0 builds none), stopped by
# `timeout 570` before its last tests; gpu_gluon.txt: test_gluon.py alone.
PYTHONPATH=$PYTHONPATH:tests timeout 570 python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 tests/gpu \
  --ignore=tests/gpu/test_native_gpu.py > $OUT/gpu_suite_cut.txt 2>&1
PYTHONPATH=$PYTHONPATH:tests python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 --durations=15 \
  tests/gpu/test_gluon.py > $OUT/gpu_gluon.txt 2>&1
