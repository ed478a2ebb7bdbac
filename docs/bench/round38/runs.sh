#!/bin/bash
# How round 38's files were made. H100 80GB HBM3, driver 580.159.04, power limit 700 W, torch 2.11.0+cu130, Triton
# 3.6.0; every call with QUANTCORE_NATIVE=0. "base" is df06b87's quantcore (`git archive df06b87 quantcore | tar -x
# -C <base>`); the tree under test is base with a diff of this folder applied. Each diff reads an environment variable
# at import (QC_RAW_RING, QC_PROD, QC_PFAKE), so that the same tree compiles base's kernel without it.
#
# Offline (no GPU): membar_probe.py under Triton 3.6 -> membar_probe.txt, membar_probe_no_arrive.txt.
#
# Call 1, raw_ring.diff in an earlier form, whose barrier addresses left out the stagger's barrier: the tree's first
#   process hung at 4096x32768x512 (the consumers staggered) until the call's 600 s ran out -> raw_ring_first.jsonl
#   (the rows measured before: 512-row shapes and two 4096-row shapes, same bits as base).
# Calls 2 and 4 ran the loop of ab_call.sh from scripts of their own (one per call), which ab_call.sh merges.
# Call 2, raw_ring.diff (the addresses checked exactly against the mbarrier.init addresses in the PTX of 23 cases):
#   BASE=<base> TREE=<raw> OUT=<dir> TAGS="base: raw:QC_RAW_RING=1" bash ab_call.sh  -> raw_ring.jsonl, raw_ring.txt
# Call 3, scale_warp.diff in an earlier form, with the stagger on: the tree's first process hung at 4096x32768x512
#   (the 2-deep product ring shorter than a tile's four K blocks, which consumer 0 takes before consumer 1 starts)
#   -> scale_warp_first.jsonl.
# Call 4, scale_warp.diff:
#   BASE=<base> TREE=<prod> OUT=<dir> TAGS="base: prod:QC_PROD=1 fake:QC_PROD=1,QC_PFAKE=1" bash ab_call.sh
#   -> scale_warp.jsonl, scale_warp.txt ("same bits" there compares every tag with base: fake's products are 1.0 by
#   design; prod's 48 outputs all have base's bits)
#
# Call 5 (2df31df's tree, whose kernels are base's): the GEMM bench behind the measured tables' per-K rankings
#   python3 -m quantcore bench --ops scaled_mm --ours-only --json gemm_h100.json --no-progress > gemm_h100.txt
#   -> gemm/gemm_h100.{json,txt,err}, gemm/device.txt
#   The shipped tables from it (H100) and from round 33's GEMM bench (H200), offline:
#     PYTHONPATH=. python3 docs/bench/round38/merge_gemm_table.py docs/bench/round38/gemm/gemm_h100.json \
#         quantcore/data/priority/nvidia-h100-80gb-hbm3.json
#     PYTHONPATH=. python3 docs/bench/round38/merge_gemm_table.py docs/bench/round33/h200/gemm_h200.json \
#         quantcore/data/priority/nvidia-h200.json
#     PYTHONPATH=. python3 docs/bench/round38/k_choice.py <run>.json  -> gemm/k_choice_h100.txt, gemm/k_choice_h200.txt
# Calls 6 and 7 (2df31df's tree): the GPU suite
#   NO_PROBE=1 PART=rest bash docs/bench/round37/final_and_suite.sh   -> gpu_division.txt, gpu_rest.txt
#   NO_PROBE=1 PART=gluon bash docs/bench/round37/final_and_suite.sh  -> gpu_gluon.txt
#   Call 7 then asked quantcore.explain for a 4096x4096x7168 FP8 GEMM on the H100: torch[cublas].
