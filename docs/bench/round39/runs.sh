#!/bin/bash
# How round 39's files were made. H100 80GB HBM3 (driver 580.159.04, power limit 700 W), torch 2.11.0+cu130, Triton
# 3.6.0, CuPy 14.2.0; the tree is 6e9b3a8's (no library change this round).
#
# Calls 1 and 4 named nvidia-h200 and were given an H100: h200_call.sh ran nothing (-> device.txt only, not kept).
#   OUT=<dir> bash docs/bench/round39/h200_call.sh
# Call 2, the end-to-end decode bench, first with the native launch path built ahead, then without it:
#   python3 -m quantcore native                                   -> e2e/native_build.txt (built in 55 s)
#   python3 -m quantcore bench --e2e --json e2e_h100_native.json  -> e2e/e2e_h100_native.{json,txt,err}
#   QUANTCORE_NATIVE=0 python3 -m quantcore bench --e2e --json e2e_h100_py.json  -> e2e/e2e_h100_py.{json,txt,err}
# Call 3, the Gluon GEMM assembled by CUDA 13.0's ptxas (TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas, V13.0.88)
#   against Triton 3.6's own ptxas 12.8, QUANTCORE_NATIVE=0:
#   OUT=<dir> bash docs/bench/round39/ptxas_call.sh                -> ptxas/ab.{jsonl,txt,err}, ptxas13.txt, device.txt
#   (the script as run also had an epilogue mode, not run, since taken out)
#   python3 docs/bench/round39/ptxas_ratio.py ptxas/ab.jsonl base px13  -> ptxas/gluon_ratio.txt
#   (ab.txt's px13 FP8 4096-row mean, 1.157, is one cuBLAS baseline timing of 430 us at 4096x2112x7168 against
#   122.9 us in the three other processes; gluon_ratio.txt compares the Gluon kernel's own times.)
# Offline (no GPU), the SASS of 8 cases from ptxas 12.8 (Triton 3.6), 12.9 (its ptxas-blackwell) and 13.0: the wide
#   tile's K loop the same instructions in all three; the epilogues' code differs in places.
