#!/bin/bash
# How round 32's run files were made on the H100 (OUT=dir; run from the repo root with QUANTCORE_NATIVE=0 and
# PYTHONPATH holding the repo root). No library change was kept: BASE is round 31's last commit's library,
# `git archive 8d225e2 quantcore | tar -x -C $BASE`, and each A/B's other tree is that commit with one diff of this
# folder applied (`git apply docs/bench/round32/<name>.diff`).
cd "$(dirname "$0")/../../.." || exit
R=docs/bench/round32
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/device.txt
# whole_tile_ab.txt / .jsonl: whole_tile.diff applied; round 28's probe, both trees alternately, two pairs of processes
# (the script names its output int8_codes.jsonl; the .txt is its --table of the .jsonl).
BASE=$BASE OUT=$OUT PROBE_MS=4096 bash docs/bench/round28/int8_codes.sh > /dev/null
mv $OUT/int8_codes.jsonl $OUT/whole_tile_ab.jsonl
python3 docs/bench/round28/int8_codes_probe.py --table $OUT/whole_tile_ab.jsonl > $OUT/whole_tile_ab.txt
# barrier_probe.txt / .jsonl: this commit's library (no diff), its PTX patched per variant (barrier_patch.py). The run
# printed its table through a script of its own; the .txt is round 23's table script over the same .jsonl.
OUT=$OUT PAIRS=2 bash $R/barrier_probe.sh > $OUT/barrier_probe.txt
# bias_first_ab.txt / .jsonl: bias_first.diff applied, as whole_tile_ab.
BASE=$BASE OUT=$OUT PROBE_MS=4096 bash docs/bench/round28/int8_codes.sh > $OUT/bias_first_ab.txt
mv $OUT/int8_codes.jsonl $OUT/bias_first_ab.jsonl
# short_k_ncu.txt, short_k_stalls_{plain,brq}.txt: this commit's library under Nsight Compute (the per-instruction
# .csv files it also writes are not kept).
OUT=$OUT bash $R/short_k_ncu.sh
# whole_tile_scales_after_ab.txt / .jsonl: whole_tile_scales_after.diff applied, as whole_tile_ab, at 4096 and 16384 rows.
BASE=$BASE OUT=$OUT PROBE_MS=4096,16384 bash docs/bench/round28/int8_codes.sh > $OUT/whole_tile_scales_after_ab.txt
mv $OUT/int8_codes.jsonl $OUT/whole_tile_scales_after_ab.jsonl
# short_k_configs.txt / .jsonl: this commit's library.
OUT=$OUT PAIRS=2 bash $R/short_k_configs.sh > $OUT/short_k_configs.txt
# review/gpu_*.txt: the GPU suite on the review commit (quant.correct_quotient, one Markstein step for divide and
# block_scale), QUANTCORE_NATIVE=0, PYTHONPATH also holding tests/: the division tests, the rest but test_gluon.py and
# test_native_gpu.py (-n 16), then test_gluon.py (-n 16).
PYTHONPATH=$PYTHONPATH:tests python3 -m pytest -q -rf -p no:cacheprovider -m gpu tests/gpu/test_quantize_division.py \
  > $OUT/review/gpu_division.txt 2>&1
PYTHONPATH=$PYTHONPATH:tests python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 tests/gpu \
  --ignore=tests/gpu/test_gluon.py --ignore=tests/gpu/test_native_gpu.py --ignore=tests/gpu/test_quantize_division.py \
  > $OUT/review/gpu_rest.txt 2>&1
PYTHONPATH=$PYTHONPATH:tests python3 -m pytest -q -rf -p no:cacheprovider -m gpu -n 16 tests/gpu/test_gluon.py \
  > $OUT/review/gpu_gluon.txt 2>&1
