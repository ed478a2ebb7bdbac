#!/bin/bash
# How round 34's files were made. H100 80GB HBM3 (device.txt), driver 580.159.04, power limit 700 W, torch
# 2.11.0+cu130, Triton 3.6.0, CuPy 14.2.0; every call with QUANTCORE_NATIVE=0. "base" is d783b28's quantcore (its
# library code is f755fd0's), unpacked beside the tree under test.
#
# Plain GEMM, beside cuBLAS block-wise (FP8) and torch._int_mm (INT8): round 23's probe (cublas_ab.py) in two or more
# trees, one process of each in turn per round (variants_ab.sh), 4096 and 16384 rows:
#   OUT=. ROUNDS=2 PROBE_MS=4096,16384 TAGS="base:<base tree> <tag>:<tree> ..." bash docs/bench/round34/variants_ab.sh
#   prefetch_l1_ab.*    tags d1 / d2 / d4: prefetch_l1.diff with PREFETCH_KB 1, 2 and 4 (two rounds)
#   smem/plain_ab.*     tag smem: smem_scales_4stages.diff (two rounds)
#   first_scales_all_ab.*   tag first: first_scales_all.diff, every epilogue preloading (two rounds)
#   first_scales_ab.*   tag new: the shipped change (three rounds), as it stood before e73ed8f's last edit of
#                       docstrings and an unused unpacking, whose SASS is the same (compiled offline, six cases)
#
# Fused epilogues, time over each tree's plain GEMM: round 28's probe, both trees alternately, two pairs of processes,
# 4096 rows ("new" is the tree on PYTHONPATH):
#   BASE=<base tree> OUT=. PROBE_MS=4096 PYTHONPATH=<tree> bash docs/bench/round28/int8_codes.sh
#   smem/epilogue.*              smem_scales_4stages.diff
#   first_scales_all_epilogue.*  first_scales_all.diff
#   epilogue_ab.*                the shipped change (the tree of first_scales_ab), 4096 and 16384 rows
#                                (PROBE_MS=4096,16384)
#
# GPU suite on the same tree as first_scales_ab, pytest -m gpu:
#   gpu_division.txt  tests/gpu/test_quantize_division.py
#   gpu_gluon.txt     -n 16 tests/gpu/test_gluon.py
#   gpu_rest.txt      -n 16 tests/gpu but test_gluon.py, test_native_gpu.py and test_quantize_division.py
#
# Every .diff here is against d783b28 (as the base tree).
#
# two_sets.diff, rotate.diff, share_weight_scale.diff: compiled offline only (Triton 3.6's ptxas, sm_90a), FP8
# 4096x7168x16384 on config_for's tile (128x256, 64-column sub-tiles), with tests/backends/test_gluon_compile.py's
# compile_launch and ptxas -v; docs/performance.md, round 34, gives their instruction and spill counts.
#
# review/gpu_gluon.txt: b4263ef's tree, timeout 330 pytest -q -rf -m gpu -n 16 tests/gpu/test_gluon.py (the call's time
# ran out at 169 of 170 tests, none failed).
