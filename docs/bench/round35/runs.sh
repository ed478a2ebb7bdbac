#!/bin/bash
# How round 35's files were made. H100 80GB HBM3 (device.txt), driver 580.159.04, power limit 700 W, torch
# 2.11.0+cu130, Triton 3.6.0, CuPy 14.2.0; every call with QUANTCORE_NATIVE=0. "base" is d0fdfdd's quantcore
# (`git archive d0fdfdd quantcore | tar -x -C <base>`), beside the tree under test. Each call's script is here.
#
# preload_probe.sh (call 1): preload_variants.diff applied to d0fdfdd, a probe-only switch (QC_PRELOAD) that gives every
# output with a bias or a re-quantization PRELOAD as well, its K block 0 scales loaded once the middle re-quantization
# group's stores are issued (2) or the last one's (3); plain outputs as shipped. Round 28's probe (int8_codes.sh), base
# and this tree alternately, two pairs of processes, time over each tree's plain GEMM:
#   preload_p2_4096.*   QC_PRELOAD=2, 4096 rows
#   preload_p3_4096.*   QC_PRELOAD=3, 4096 rows
#   preload_p2_16384.*  QC_PRELOAD=2, 16384 rows
#
# ncu_and_plain.sh (call 2), the same tree:
#   epilogue_ncu.txt          Nsight Compute (--clock-control none; SpeedOfLight, WarpStateStats, SchedulerStats) on
#                             round 32's probe, INT8 re-quantized at 4096x32768x512 and bias + re-quantized at
#                             4096x4096x7168, QC_PRELOAD unset and 3. (The per-reason stall counts were not printed:
#                             the section gives them only with its details.)
#   plain_after_stores_ab.*   round 23's probe (cublas_ab.py) at 4096 and 16384 rows, plain outputs with PRELOAD after
#                             the main loop (p1, shipped) and after the stores (p3, QC_PRELOAD_PLAIN=3), one process of
#                             each in turn, two rounds
#
# stalls_ncu.sh (call 5), preload_variants.diff's tree again:
#   stalls_ncu.txt   Nsight Compute, the kernel's duration, instructions executed and every
#                    smsp__average_warps_issue_stalled_*_per_issue_active.ratio, for the same four kernels as
#                    epilogue_ncu.txt; the table at its end is what the script printed
#                    from them.
#
# final_and_suite.sh (call 3), the rule as in gluon_launch.preload (the tree before dafd462's last edit, below):
#   final_epilogue.*  round 28's probe against base, two pairs of processes, 4096 and 16384 rows
#   gpu_division.txt  pytest -m gpu tests/gpu/test_quantize_division.py
#   gpu_rest.txt      pytest -m gpu -n 16 tests/gpu but test_gluon.py, test_native_gpu.py, test_quantize_division.py
# Call 4, dafd462's tree:
#   gpu_gluon.txt     timeout 560 pytest -q -rf -m gpu -n 16 tests/gpu/test_gluon.py
#
# dafd462's last edit (docstrings, and _first_scales standing for the lines it replaced) left the SASS the same, byte
# for byte, in the ten cases compiled offline (Triton 3.6's ptxas, sm_90a): the plain wide tile at K = 512 and 16384
# (FP8, INT8), N = 2112, re-quantized at K = 512 and N = 2112, bias + re-quantized at K = 512 and 1536, and the two
# kernels that take PRELOAD "stores" there (re-quantized FP8 and INT8 at 4096x7168x2048). The first eight are base's
# SASS too.
