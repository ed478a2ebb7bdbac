#!/bin/bash
# Round 35 call 3: the shipped rule (PRELOAD "stores" for re-quantized outputs without a bias, stagger or N's last
# column loop) against HEAD (d0fdfdd) with round 28's probe, 4096 and 16384 rows; then the GPU suite but test_gluon.py.
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
mkdir -p $OUT/final
BASE=${BASE:-$PWD/.scratch/r35/base} OUT=$OUT/final PROBE_MS=4096,16384 timeout 260 bash docs/bench/round28/int8_codes.sh > $OUT/final/table.txt 2>&1
echo "probe rc $? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/final/table.txt
export PYTHONPATH=$PYTHONPATH:$PWD/tests
timeout 200 python3 -m pytest -q -rf -p no:cacheprovider -m gpu tests/gpu/test_quantize_division.py > $OUT/gpu_division.txt 2>&1
timeout 340 python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 tests/gpu --ignore=tests/gpu/test_gluon.py \
    --ignore=tests/gpu/test_native_gpu.py --ignore=tests/gpu/test_quantize_division.py > $OUT/gpu_rest.txt 2>&1
