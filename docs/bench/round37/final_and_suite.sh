#!/bin/bash
# Round 37's last calls: the shipped rule (`gluon_launch.k_positive`) against BASE (0440f49's quantcore) with round
# 28's probe, 4096 and 16384 rows, then the GPU suite: PART=rest (the division tests, then tests/gpu but test_gluon.py
# and the native tests) or PART=gluon (tests/gpu/test_gluon.py), each without the probe where NO_PROBE=1.
# Usage: BASE=<tree> OUT=<dir> PART=rest|gluon bash docs/bench/round37/final_and_suite.sh
[ "$NO_PROBE" = 1 ] || bash docs/bench/round37/assume_call.sh final
export PYTHONPATH=$PYTHONPATH:$PWD/tests
t0=$(date +%s)
if [ "$PART" = rest ]; then
  timeout 200 python3 -m pytest -q -rf -p no:cacheprovider -m gpu tests/gpu/test_quantize_division.py > $OUT/gpu_division.txt 2>&1
  echo "division rc $?"; tail -1 $OUT/gpu_division.txt
  timeout 340 python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 tests/gpu --ignore=tests/gpu/test_gluon.py \
      --ignore=tests/gpu/test_native_gpu.py --ignore=tests/gpu/test_quantize_division.py > $OUT/gpu_rest.txt 2>&1
  echo "rest rc $?"; tail -2 $OUT/gpu_rest.txt
else
  timeout 560 python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 tests/gpu/test_gluon.py > $OUT/gpu_gluon.txt 2>&1
  echo "gluon rc $?"; tail -2 $OUT/gpu_gluon.txt
fi
echo "suite $(( $(date +%s) - t0 )) s"
