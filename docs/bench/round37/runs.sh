#!/bin/bash
# How round 37's files were made. H100 80GB HBM3 (device.txt), driver 580.159.04, power limit 700 W, torch
# 2.11.0+cu130, Triton 3.6.0, CuPy 14.2.0; every call with QUANTCORE_NATIVE=0. "base" is 0440f49's quantcore
# (`git archive 0440f49 quantcore | tar -x -C <base>`), beside the tree under test.
#
# Call 1, 0440f49 with shift.diff applied (a GluonConfig field `shift`: consumer 1's K loop runs its steps from a K
# block's sub-tile `shift` to the next K block's sub-tile shift - 1, so that the end of its step, where it has no wgmma
# in flight, falls within consumer 0's K block; at shift 0 the SASS is 0440f49's, byte for byte, in five cases
# compiled offline):
#   OUT=<dir> bash shift_call.sh shift    shift.jsonl, shift.txt: base, s1, s2, s3 (each shift below the tile's column
#                                         sub-tiles) and cuBLAS block-wise FP8 or torch._int_mm, timed interleaved,
#                                         two processes, 4096 and 16384 rows (round 36's aregs_probe.py machinery)
#
# Calls 2-4, round 28's probe (re-quantized and bias + re-quantized outputs over each tree's plain GEMM, base and the
# tree alternately, two pairs of processes, every output's bits compared) through assume_call.sh:
#   assume/   the kernel told that K >= 1 wherever the output is re-quantized (PRELOAD "stores" kernels included)
#   gated/    the same only where PRELOAD is "none" (the other kernels then are base's, byte for byte)
#   final/    the shipped rule, `gluon_launch.k_positive` (gated's, on column sub-tiles only, and not for FP8 with
#             N's last column loop), in final_and_suite.sh PART=rest, which then ran
#   gpu_division.txt  pytest -m gpu tests/gpu/test_quantize_division.py
#   gpu_rest.txt      pytest -m gpu -n 16 tests/gpu but test_gluon.py, test_native_gpu.py, test_quantize_division.py
# Call 5, the same tree: NO_PROBE=1 PART=gluon bash final_and_suite.sh
#   gpu_gluon.txt     pytest -m gpu -n 16 tests/gpu/test_gluon.py
#
# Call 6, plain outputs beside cuBLAS block-wise / torch._int_mm: round 23's probe in two trees, one process of each in
# turn, two rounds (round 34's variants_ab.sh), 4096 and 16384 rows:
#   OUT=plain_kp ROUNDS=2 BUDGET=420 TAGS="base:<base> kp:<tree>" bash docs/bench/round34/variants_ab.sh
#   plain_kp/ab.*   kp: the shipped tree with k_positive also true for PRELOAD "loop" (plain outputs on column
#                   sub-tiles), whose K loop has 2 instructions fewer (offline)
#
# Compiled offline only (Triton 3.6's ptxas, sm_90a), not measured:
#   late_release.diff  each K block's slot released after the next K block's ready wait instead of before it, to take
#                      one named barrier out of the K loop: the loop keeps two (Triton's barrier analysis puts one on
#                      each side of the arrival) and grows from 255 to 263 instructions
