#!/bin/bash
# Round 39: the same Gluon GEMM source assembled by CUDA 13.0's ptxas (TRITON_PTXAS_PATH) instead of the ptxas 12.8
# that Triton 3.6 ships, in one tree: round 23's probe (cublas_ab.py: config_for's tile beside cuBLAS block-wise FP8 or
# torch._int_mm, a checksum of each output's bits), processes of each assembler in turn, two rounds, 4096 and 16384
# rows (round 38's ab_call.sh). Usage: OUT=<dir> bash docs/bench/round39/ptxas_call.sh
PX=${PX:-/usr/local/cuda/bin/ptxas}
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader > $OUT/device.txt
[ -x "$PX" ] || { echo "no ptxas at $PX"; exit 1; }
$PX --version | tail -2 | tee $OUT/ptxas13.txt
cd "$(dirname "$0")/../../.."
BASE=$PWD TREE=$PWD TAGS="base: px13:TRITON_PTXAS_PATH=$PX" bash docs/bench/round38/ab_call.sh
