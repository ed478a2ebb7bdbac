#!/bin/bash
# How round 33's files were made. H100 80GB HBM3 (device.txt) and H200 (h200/device.txt), driver 580.159.04,
# torch 2.11.0+cu130, Triton 3.6.0, CuPy 14.2.0; every call with QUANTCORE_NATIVE=0.
#
# gluon_long_k_stalls.txt (H100): round 29's probe under Nsight Compute 2025.3.1, per-instruction stall samples of
# the Gluon GEMM at 4096x7168x16384 FP8 (the same command was run on cuBLAS's kernel; its disassembly is not kept
# here, its structure is described in docs/performance.md, round 33):
#   ncu --clock-control none -k regex:block_scaled_mm_ws --launch-skip 4 --launch-count 1 --section WarpStateStats \
#       --section SourceCounters --page source --print-source sass --csv \
#       python3 docs/bench/round29/long_k_ncu.py gluon 4096 7168 16384 > gluon.csv    (cublas, -k regex:nvjet)
#   python3 docs/bench/round9/ncu_stalls.py gluon.csv 60 > gluon_long_k_stalls.txt
#
# alternate.txt / .jsonl, square.txt / .jsonl (H100): alt_probe.py on a tree with alternate.diff applied, every case
# compiled first in 12 processes, then two timed processes:
#   for i in $(seq 0 11); do python3 alt_probe.py --warm $i 12 & done; wait
#   for r in 1 2; do python3 alt_probe.py run$r >> alternate.jsonl; done; python3 alt_probe.py --table alternate.jsonl
#   (square: the same with VARIANTS=square)
#
# late_loads_ab.txt / .jsonl (H100): the scale loads issued after each K block's first wgmma (late_loads.diff, not
# shipped) against HEAD (f755fd0) unpacked under BASE, round 23's probe, two pairs of processes:
#   BASE=<f755fd0 tree> OUT=. PAIRS=2 PROBE_MS=512,4096,16384 bash docs/bench/round23/cublas_ab.sh
#
# h200/ (H200, the first lent in twelve calls that asked for one):
#   gemm_h200.*:  python3 -m quantcore bench --ops scaled_mm --json gemm_h200.json --no-progress > gemm_h200.txt
#   cublas_ab.*:  BASE=<f755fd0 tree> OUT=. PAIRS=2 bash docs/bench/round23/cublas_ab.sh (both trees f755fd0: four
#                 processes of the same code)
#   epilogue.*:   BASE=<f755fd0 tree> OUT=. PROBE_MS=4096,16384 bash docs/bench/round28/int8_codes.sh; the tag "base"
#                 ran twice; the tag "new" failed at import (the tree was not on PYTHONPATH), so one tree's two
#                 processes, which the table's medians are of
#   e2e_h200.*:   python3 -m quantcore bench --e2e --json e2e_h200.json > e2e_h200.txt
#   gpu_*.txt:    pytest -m gpu: tests/gpu/test_quantize_division.py; -n 16 tests/gpu but test_gluon.py,
#                 test_native_gpu.py and test_quantize_division.py; -n 16 tests/gpu/test_gluon.py
#   The H200's measured table's scaled_mm entries (quantcore/data/priority/nvidia-h200.json):
#     python3 -m quantcore bench --from-json h200/gemm_h200.json --write-priority /tmp/prio, its two scaled_mm
#     entries copied into the shipped table, the other ops' left as round 13 wrote them.
#
# h200/no_scale_loads_ab.* (H200): the K loop without its scale loads (no_scale_loads.diff: K block 0's scales for
# every K block, loaded once a tile; wrong numerics by design, so "same bits" reads NO) against f755fd0:
#   BASE=<f755fd0 tree> OUT=. PAIRS=2 PROBE_MS=4096,16384 bash docs/bench/round23/cublas_ab.sh
#
# h200/smem_scales.* (H200): alt_probe.py with VARIANTS=smem on a tree with smem_scales.diff applied (the producer
# copies each K block's activation and weight scales into shared memory with cp.async, tracked by the slot's ready
# barrier; the consumers read them after the K block's first wgmma), compiled in 12 processes, two timed processes.
#
# prefetch_mid_ab.* (H100): each step loads the next K block's scales after its first wgmma (prefetch_mid.diff) against
# f755fd0: BASE=<f755fd0 tree> OUT=. PAIRS=2 PROBE_MS=512,4096,16384 bash docs/bench/round23/cublas_ab.sh
